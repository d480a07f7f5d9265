//! A full member map: the child forked at the capacity is still tracked (the map keeps a
//! reserve beyond it), so nothing of the tree runs untracked for a moment; it is counted as a
//! failed insert of its tree, visible to user space, so a caller can fail closed; and the member
//! that forked it is killed as it forks, so the tree makes no more. (tests/fail_closed.rs has
//! the daemon kill the tree.)

use std::os::unix::process::ExitStatusExt;

use leash::Capacity;
use leash_tests::{Cgroup, Scenario, tracked, tracker};

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
    // The root and 7 sleeps filled the map; the 8th sleep went into the reserve.
    let truth = scenario.cgroup.settle(8, &["sleep"]);
    let members = tracked(&tracker, scenario.tree);
    let status = tracker.tree_status(scenario.tree).unwrap();
    eprintln!(
        "map full: capacity 8, ground truth {}, tracked {}, failed inserts {}",
        truth.len(),
        members.len(),
        status.failed_inserts
    );
    assert_eq!(
        members, truth,
        "every process of the tree is tracked, the one forked at the capacity too"
    );
    assert_eq!(
        status.failed_inserts, 1,
        "one child was forked past the capacity, and no more were made"
    );
    assert_eq!(tracker.stats().unwrap().inserts_failed, 1);
}

/// Adopting a tree larger than the room left is refused, and what the pass put in before it
/// stopped is taken out and counted out again: the room is whole for the next registration.
#[test]
fn an_adoption_past_the_capacity_is_refused_and_leaves_the_room_as_it_was() {
    let capacity = Capacity {
        members: 8,
        ..Capacity::default()
    };
    let Some(mut tracker) = tracker!(capacity) else {
        return;
    };
    let big = Cgroup::new("adopt-full");
    let mut root = big
        .command(
            "sh",
            &["-c", "for i in $(seq 20); do sleep 600 & done; wait"],
        )
        .spawn()
        .unwrap();
    big.settle(21, &["sleep", "sh"]);
    let refused = tracker.adopt(root.id());
    assert!(
        refused.is_err(),
        "21 processes do not fit a capacity of 8: {refused:?}"
    );
    assert!(
        tracker.member(root.id()).is_none(),
        "the refused tree's root is out of the map"
    );
    big.kill_all();
    let _ = root.wait();

    // All 8 places are free again: a tree of 8 fits.
    let small = Cgroup::new("adopt-fits");
    let mut root = small
        .command(
            "sh",
            &["-c", "for i in $(seq 7); do sleep 600 & done; wait"],
        )
        .spawn()
        .unwrap();
    small.settle(8, &["sleep", "sh"]);
    let tree = tracker
        .adopt(root.id())
        .expect("a tree of 8 in a room of 8");
    assert_eq!(tracker.tree_status(tree).unwrap().seeded, 8);
    small.kill_all();
    let _ = root.wait();
}
