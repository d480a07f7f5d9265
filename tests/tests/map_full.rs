//! A full member map: the children that do not fit are counted as failed inserts of their tree,
//! visible to user space, so a caller can fail closed.

use leash::Capacity;
use leash_tests::{Scenario, tracked, tracker};

#[test]
fn a_failed_insert_is_counted_per_tree() {
    let capacity = Capacity {
        members: 8,
        ..Capacity::default()
    };
    let Some(mut tracker) = tracker!(capacity) else {
        return;
    };
    let script = "for i in $(seq 20); do sleep 600 & done; exec sleep 600";
    let scenario = Scenario::spawn(&mut tracker, "map-full", "sh", &["-c", script]);
    let truth = scenario.cgroup.settle(21, &["sleep"]);
    let members = tracked(&tracker, scenario.tree);
    let status = tracker.tree_status(scenario.tree).unwrap();
    eprintln!(
        "map full: capacity 8, ground truth {}, tracked {}, failed inserts {}",
        truth.len(),
        members.len(),
        status.failed_inserts
    );
    assert_eq!(members.len(), 8);
    assert!(members.is_subset(&truth));
    assert_eq!(
        status.failed_inserts, 13,
        "each of the 13 children that did not fit is counted"
    );
    assert_eq!(tracker.stats().unwrap().inserts_failed, 13);
}
