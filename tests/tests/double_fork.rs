//! A double-forked daemon: the middle process exits, the daemon is reparented to init and is no
//! longer anyone's descendant in /proc. It is still a member.

use leash_tests::{Scenario, assert_tracks_cgroup, ppid, tracker};

#[test]
fn a_double_forked_daemon_stays_a_member() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let script = "(setsid sleep 600 &); exec sleep 600";
    let scenario = Scenario::spawn(&mut tracker, "double-fork", "sh", &["-c", script]);
    let procs = scenario.cgroup.settle(2, &["sleep"]);
    let daemon = *procs.iter().find(|&&p| p != scenario.root_pid()).unwrap();
    let daemon_parent = ppid(daemon).unwrap();
    assert_ne!(
        daemon_parent,
        scenario.root_pid(),
        "the daemon should have been reparented"
    );
    assert!(
        tracker.member(daemon_parent).is_none(),
        "its new parent is outside the tree"
    );
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "double-forked daemon",
    );
    assert_eq!(tracked, 2);
}
