//! Stopping the daemon (SIGTERM) kills every live tree first: a tree that outlives its
//! enforcer is the failure leash exists to prevent. Then each connection's last line is a
//! `closing` event that says so, and a host's next call says its trees were killed.

use std::time::Duration;

use leash_client::{ClosingReason, Error, EventKind, TreeOptions};
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

    // The host did not subscribe: the daemon's last line is its only event.
    let closing = host
        .next_event(Some(Duration::from_secs(5)))
        .expect("the closing event, before the connection's end")
        .expect("an event, not a timeout");
    assert_eq!(closing.kind, EventKind::Closing, "{closing:?}");
    assert_eq!(
        closing.closing_reason(),
        Some(ClosingReason::Shutdown),
        "{closing:?}"
    );
    assert_eq!(closing.lease, host.lease().id);
    let error = host.status().expect_err("the connection is closed");
    assert!(
        matches!(error, Error::Closed(Some(ClosingReason::Shutdown))),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("killed this lease's trees"),
        "{error}"
    );
}
