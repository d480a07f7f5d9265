//! The root's exit is recorded in the tree's state in the kernel, not only as an event, and
//! its descendants stay members after it.

use leash_common::EventKind;
use leash_tests::{Scenario, assert_tracks_cgroup, tracker};

#[test]
fn the_root_exit_is_in_the_map_and_its_orphans_stay_members() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let script = "sleep 600 & setsid sleep 600 & exit 3";
    let mut scenario = Scenario::spawn(&mut tracker, "root-exit", "sh", &["-c", script]);
    let root = scenario.root_pid();
    assert_eq!(
        tracker.tree_status(scenario.tree).unwrap().root_exit_ns,
        None
    );
    let status = scenario.root.wait().unwrap();
    assert_eq!(status.code(), Some(3));

    let state = tracker.tree_status(scenario.tree).unwrap();
    assert!(
        state.root_exit_ns.is_some(),
        "the root's exit must be in the map: {state:?}"
    );
    assert_eq!(state.root, root);
    assert!(
        tracker.member(root).is_none(),
        "the dead root is no longer a member"
    );
    scenario.cgroup.settle(2, &["sleep"]);
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            scenario.tree,
            &scenario.cgroup,
            "orphans after the root exited"
        ),
        2
    );

    // The event stream tells the same story, for those who listen.
    let events = tracker.drain_events();
    assert!(
        events
            .iter()
            .any(|e| e.kind == EventKind::RootExit && e.pid == root && e.tree == scenario.tree)
    );
}
