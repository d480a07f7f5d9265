//! A full member map: the child that does not fit is counted as a failed insert of its tree,
//! visible to user space, so a caller can fail closed; and the member that forked it is killed
//! as it forks, so the tree makes no more. (Without a daemon, nothing kills the child itself:
//! tests/fail_closed.rs has the daemon do it.)

use std::os::unix::process::ExitStatusExt;

use leash::Capacity;
use leash_tests::{Scenario, tracked, tracker};

#[test]
fn a_failed_insert_is_counted_and_its_forker_killed() {
    let capacity = Capacity {
        members: 8,
        ..Capacity::default()
    };
    let Some(mut tracker) = tracker!(capacity) else {
        return;
    };
    let script = "for i in $(seq 20); do sleep 600 & done; exec sleep 600";
    let mut scenario = Scenario::spawn(&mut tracker, "map-full", "sh", &["-c", script]);
    let died = scenario.root.wait().unwrap();
    assert_eq!(
        died.signal(),
        Some(libc::SIGKILL),
        "the member whose child did not fit dies as it forks: {died:?}"
    );
    // The root and 7 sleeps filled the map; the 8th sleep did not fit.
    let truth = scenario.cgroup.settle(8, &["sleep"]);
    let members = tracked(&tracker, scenario.tree);
    let status = tracker.tree_status(scenario.tree).unwrap();
    eprintln!(
        "map full: capacity 8, ground truth {}, tracked {}, failed inserts {}",
        truth.len(),
        members.len(),
        status.failed_inserts
    );
    assert_eq!(members.len(), 7);
    assert!(members.is_subset(&truth));
    assert_eq!(
        status.failed_inserts, 1,
        "one child did not fit, and no more were made"
    );
    assert_eq!(tracker.stats().unwrap().inserts_failed, 1);
}
