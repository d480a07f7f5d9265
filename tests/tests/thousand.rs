//! A tree of 1001 processes: 10 shells that fan out 99 sleeps each.

use leash_tests::{Scenario, assert_tracks_cgroup, tracker};

#[test]
fn a_thousand_process_tree_is_tracked_exactly() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let script = r#"for i in $(seq 10); do sh -c 'for j in $(seq 99); do sleep 600 & done; exec sleep 600' & done; exec sleep 600"#;
    let scenario = Scenario::spawn(&mut tracker, "thousand", "sh", &["-c", script]);
    scenario.cgroup.settle(1001, &["sleep"]);
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "1001-process tree",
    );
    assert_eq!(tracked, 1001);
}
