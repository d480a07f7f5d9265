//! Fail closed: a tree that cannot be fully tracked (the member map is full) is killed by the
//! daemon, not left half-watched, and the child that did not fit is killed too: the member
//! that forked it dies in the kernel as it forks, and the daemon kills the child on the kernel's
//! word.

use std::time::Duration;

use leash_client::{EventKind, TreeOptions};
use leash_tests::daemon::{Daemon, LeashedTree};

#[test]
fn a_tree_the_map_cannot_hold_is_killed() {
    let Some(daemon) = Daemon::start(&["--max-members", "8"]) else {
        return;
    };
    let mut watcher = daemon.client();
    watcher.subscribe().unwrap();
    let mut host = daemon.client();
    let script = "for i in $(seq 20); do sleep 600 & done; wait";
    let mut tree = LeashedTree::spawn(
        &mut host,
        "fail-closed",
        "sh",
        &["-c", script],
        &TreeOptions::default(),
    );

    let mut reason = None;
    while let Some(event) = watcher.next_event(Some(Duration::from_secs(10))).unwrap() {
        if event.tree == tree.tree && event.kind == EventKind::KillStarted {
            reason = event.reason;
            break;
        }
    }
    assert!(
        reason.as_deref() == Some("untrackable"),
        "the daemon must kill the tree as untrackable: {reason:?}"
    );
    assert!(
        tree.root.wait().is_ok_and(|s| !s.success()),
        "the root, a member, was killed"
    );
    assert!(
        tree.cgroup.wait_empty(Duration::from_secs(10)).is_some(),
        "left running, tracked or not: {:?}",
        tree.cgroup.procs()
    );
    let status = host.status().unwrap();
    eprintln!(
        "fail closed: capacity 8, {} inserts failed, tree killed",
        status.inserts_failed
    );
    assert!(status.inserts_failed > 0);
}
