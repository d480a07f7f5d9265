//! Fail closed: a tree that forks past the member capacity is killed by the daemon, not left
//! half-watched. The child forked at the capacity is tracked all the same (in the map's reserve)
//! and its forker dies in the kernel as it forks, so nothing it starts gets away: a `setsid`
//! grandchild forked the moment the child runs is a member too.

use std::time::Duration;

use leash_client::{EventKind, EventReason, TreeOptions, protocol::KillReason};
use leash_tests::daemon::{Daemon, LeashedTree};

/// Kills `tree`'s members as soon as it is found untrackable.
const NO_GRACE: TreeOptions = TreeOptions {
    on_root_exit: leash_client::RootExitPolicy::Kill,
    grace: Some(Duration::ZERO),
};

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
        reason == Some(EventReason::Kill(KillReason::Untrackable)),
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

/// The escape a full map used to allow: the child that did not fit forked a `setsid` grandchild
/// before the daemon could kill it, and the grandchild, never a member, lived on. Every child
/// is a member now, so every trial's cgroup empties.
#[test]
fn nothing_forked_at_the_capacity_escapes() {
    const TRIALS: usize = 20;
    let Some(daemon) = Daemon::start(&["--max-members", "16"]) else {
        return;
    };
    let mut host = daemon.client();
    // Eight workers fork at once; each subshell, a worker's child, forks a new session's sleep
    // and exits, until the capacity stops them. (The shells' word of each kill is not kept.)
    let script = "exec 2>/dev/null; for w in 1 2 3 4 5 6 7 8; do \
                    (i=0; while [ $i -lt 20 ]; do (setsid sleep 600 &); i=$((i+1)); done) & \
                  done; wait";
    let mut escapes = Vec::new();
    for trial in 0..TRIALS {
        let mut tree = LeashedTree::spawn(
            &mut host,
            &format!("capacity-escape-{trial}"),
            "sh",
            &["-c", script],
            &NO_GRACE,
        );
        let _ = tree.root.wait();
        if tree.cgroup.wait_empty(Duration::from_secs(10)).is_none() {
            escapes.push((trial, tree.cgroup.procs()));
        }
    }
    let status = host.status().unwrap();
    eprintln!(
        "{TRIALS} trials at a capacity of 16: {} escaped, {} forks past the capacity",
        escapes.len(),
        status.inserts_failed
    );
    assert!(escapes.is_empty(), "left running: {escapes:?}");
    assert!(
        status.inserts_failed >= TRIALS as u64,
        "every trial hit the capacity"
    );
}
