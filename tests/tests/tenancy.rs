//! Tenancy by pid namespace: pods without user namespaces share uids, so a uid cannot tell one
//! tenant from another. A client in a container sees and acts only on the trees registered
//! from its own pid namespace or one nested in it. Two containers of the same uid (made here
//! with `unshare`, as root and rootless): the second neither lists the first's tree nor kills
//! it, while the host's namespace sees it.

use std::time::Duration;

use leash_tests::{
    Cgroup,
    container::{CONTAINERS, Container},
    daemon::Daemon,
    wait_for,
};
use serde_json::Value;

#[test]
fn a_container_sees_and_touches_only_its_own_trees() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        one_tenant_beside_another(&daemon, container);
    }
}

fn one_tenant_beside_another(daemon: &Daemon, container: Container) {
    let first = Cgroup::new("tenancy-first");
    let mut host = container
        .leash(daemon, &first, &["run", "--", "sleep", "600"])
        .spawn()
        .unwrap();
    let mut outside = daemon.client();
    let mut tree = None;
    let registered = wait_for(Duration::from_secs(20), || {
        let procs = first.procs();
        tree = outside
            .list()
            .unwrap()
            .into_iter()
            .find(|t| procs.contains(&t.root))
            .map(|t| t.tree);
        tree.is_some()
    });
    assert!(registered, "{container:?}: the first container's tree");
    let tree = tree.unwrap().to_string();
    let members = first.procs();

    let second = Cgroup::new("tenancy-second");
    let listed = container
        .leash(daemon, &second, &["ls", "--json"])
        .output()
        .unwrap();
    let trees: Value = serde_json::from_slice(&listed.stdout).unwrap_or_else(|e| {
        panic!(
            "{container:?}: leash ls --json ({e}): {}",
            String::from_utf8_lossy(&listed.stderr)
        )
    });
    assert_eq!(
        trees,
        Value::Array(vec![]),
        "{container:?}: another container of the same uid lists nothing of the first's"
    );
    let killed = container
        .leash(daemon, &second, &["kill", &tree, "--grace", "0"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&killed.stderr);
    assert!(
        !killed.status.success() && said.contains(&format!("no tree {tree}")),
        "{container:?}: the second container may not kill the first's tree: {said}"
    );
    assert_eq!(
        first.procs(),
        members,
        "{container:?}: the first's tree lives"
    );

    let _ = host.kill();
    let _ = host.wait();
    assert!(first.wait_empty(Duration::from_secs(10)).is_some());
}
