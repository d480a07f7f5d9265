//! The `leash exec --lease TOKEN -- CMD` shim: a host in any language prefixes argv, the shim
//! registers itself under the host's lease and execs CMD. The tree then lives and dies with
//! that lease.

use std::time::Duration;

use leash_client::EventKind;
use leash_tests::{Cgroup, daemon::Daemon, leash_binary};

#[test]
fn a_shim_spawned_tree_dies_with_its_hosts_lease() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    host.subscribe().unwrap();
    let cgroup = Cgroup::new("exec-shim");
    // What a Node or Python host would do: spawn the shim's argv, untracked by itself.
    let argv = host.exec_argv(
        leash_binary(),
        cgroup.argv("sh", &["-c", "setsid sleep 600 & exec sleep 600"]),
    );
    let mut shim = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("LEASH_SOCKET", &daemon.socket)
        .spawn()
        .unwrap();
    cgroup.settle(2, &["sleep"]);
    let registered = host
        .next_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("an event");
    assert_eq!(registered.kind, EventKind::Registered);
    assert_eq!(
        registered.pid,
        Some(shim.id()),
        "the shim registered itself, then exec'd"
    );
    let trees = host.list().unwrap();
    assert_eq!(trees.len(), 1);
    assert_eq!(
        trees[0].lease,
        host.lease().id,
        "the tree is under the host's lease"
    );
    assert_eq!(trees[0].members.len(), 2);

    drop(host);
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host lease closed: shim-spawned tree empty after {emptied:?}");
    assert!(emptied.is_some(), "the tree outlived its host's lease");
    let _ = shim.wait();
}

#[test]
fn a_shim_with_a_bad_token_runs_nothing() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let marker = daemon.dir.join("ran");
    let output = daemon
        .leash()
        .args([
            "exec",
            "--lease",
            "0123456789abcdef0123456789abcdef",
            "--",
            "touch",
        ])
        .arg(&marker)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no live lease has that token"));
    assert!(!marker.exists(), "the command must not run unregistered");
}
