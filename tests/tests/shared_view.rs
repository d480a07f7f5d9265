//! A view of the tracker's maps, made before anything is registered and read from another
//! thread, sees each tree the tracker registers, its members and its counters, and sees it go.

use std::{thread, time::Duration};

use leash::kernel::{TrackerView, fill_comms};
use leash_tests::{Scenario, tracker, wait_for};

#[test]
fn a_view_made_before_a_registration_sees_the_tree_and_its_members() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let view = tracker.shared_view().expect("a shared view");
    assert!(view.trees().is_empty());
    let mut scenario = Scenario::spawn(
        &mut tracker,
        "shared-view",
        "sh",
        &["-c", "sleep 600 & sleep 600 & wait"],
    );
    let truth = scenario.cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let tree = scenario.tree;

    let read_elsewhere = |view: &TrackerView| {
        thread::scope(|s| {
            s.spawn(|| {
                let mut members = view.members(tree).expect("members");
                fill_comms(&mut members);
                (view.trees(), view.tree_status(tree).ok(), members)
            })
            .join()
            .expect("the reading thread")
        })
    };
    let (trees, status, members) = read_elsewhere(&view);
    assert_eq!(trees, vec![tree]);
    let status = status.expect("the tree's status");
    assert_eq!(status.members, 3);
    assert_eq!(status.root, scenario.root_pid());
    let pids: std::collections::BTreeSet<_> = members.iter().map(|m| m.pid).collect();
    assert_eq!(pids, truth);
    assert!(
        members.windows(2).all(|w| w[0].start_ns <= w[1].start_ns),
        "oldest first: {members:?}"
    );
    let mut comms: Vec<_> = members.into_iter().filter_map(|m| m.comm).collect();
    comms.sort();
    assert_eq!(comms, ["sh", "sleep", "sleep"]);
    assert_eq!(view.member(scenario.root_pid()).map(|m| m.tree), Some(tree));

    tracker.kill(tree, Duration::ZERO).expect("kill");
    let _ = scenario.root.wait();
    assert!(view.is_empty(tree).unwrap());
    assert!(view.tree_status(tree).unwrap().doomed_ns.is_some());
    tracker.release(tree).unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || read_elsewhere(&view)
            .0
            .is_empty()),
        "the view still sees the released tree"
    );
    assert!(view.tree_status(tree).is_err());
}
