//! A pending grace can only get shorter. A tree's grace is at most what it was registered with,
//! whatever a later kill asks; and a later kill (here root's, with no grace) shortens one under
//! way. As uid 61001: a host registers a stubborn tree with a 30 s grace, and the user's kill
//! asks for ten minutes; root's `leash kill --grace 0` then ends it at once.

use std::{
    process::Child,
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A},
    wait_for,
};

const STUBBORN: &str = r#"trap "" TERM; sleep 600 & wait"#;

#[test]
fn roots_kill_shortens_a_pending_grace() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let as_user = |cgroup: &Cgroup, args: &[&str]| -> Child {
        daemon.leash_as(USER_A, cgroup, args).spawn().unwrap()
    };
    let tree_cgroup = Cgroup::new("long-grace");
    let mut host = as_user(
        &tree_cgroup,
        &["run", "--grace", "30s", "--", "sh", "-c", STUBBORN],
    );
    tree_cgroup.settle_exactly(&["leash", "sh", "sleep"]);
    let tree = daemon.client().list().unwrap()[0].tree.to_string();

    // The user, at a terminal (in no tree), asks for ten minutes: the tree's 30 s is the most.
    let terminal = Cgroup::new("terminal");
    let mut users_kill = as_user(&terminal, &["kill", "--grace", "10m", &tree]);
    let mut root = daemon.client();
    assert!(
        wait_for(Duration::from_secs(10), || root
            .list()
            .unwrap()
            .first()
            .is_some_and(|t| t.state.as_str() == "killing")),
        "the user's kill did not start"
    );

    let started = Instant::now();
    let roots_kill = daemon
        .leash()
        .args(["kill", "--grace", "0", &tree])
        .output()
        .unwrap();
    let took = started.elapsed();
    eprintln!("root's kill --grace 0 under a pending 30 s grace took {took:?}");
    assert!(
        roots_kill.status.success(),
        "{}",
        String::from_utf8_lossy(&roots_kill.stderr)
    );
    assert!(
        took < Duration::from_secs(20),
        "root's kill waited out the pending grace: {took:?}"
    );
    // The host's `leash run` and the user's kill both end with the tree.
    let ended = wait_for(Duration::from_secs(10), || {
        tree_cgroup.procs().is_empty() && users_kill.try_wait().unwrap().is_some()
    });
    let _ = host.wait();
    let _ = users_kill.kill();
    assert!(
        ended,
        "left in the tree's cgroup: {:?}",
        tree_cgroup.procs()
    );
}
