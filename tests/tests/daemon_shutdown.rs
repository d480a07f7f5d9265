//! Stopping the daemon (SIGTERM) kills every live tree first: a tree that outlives its
//! enforcer is the failure leash exists to prevent.

use std::time::Duration;

use leash_client::TreeOptions;
use leash_tests::{Cgroup, daemon::Daemon};

#[test]
fn shutdown_kills_live_trees_and_removes_the_socket() {
    let Some(mut daemon) = Daemon::start(&["--grace", "100ms"]) else {
        return;
    };
    let mut host = daemon.client();
    let cgroup = Cgroup::new("shutdown");
    let (_tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "setsid sleep 600 & exec sleep 600"]),
            &TreeOptions::default(),
        )
        .unwrap();
    cgroup.settle(2, &["sleep"]);
    assert!(daemon.stop(), "the daemon exits cleanly on SIGTERM");
    assert!(
        cgroup.wait_empty(Duration::from_secs(5)).is_some(),
        "live trees are killed at shutdown"
    );
    assert!(!daemon.socket.exists(), "the socket is removed");
    let _ = root.wait();
}
