//! The root's exit is recorded in the tree's state in the kernel, not only as an event, and
//! its descendants stay members after it.

use std::time::Duration;

use aya::maps::{HashMap, Map, MapData};
use leash_client::TreeOptions;
use leash_common::{EventKind, Member, Pid, map};
use leash_tests::{
    Scenario, assert_tracks_cgroup,
    daemon::{Daemon, LeashedTree},
    tracker,
};

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

/// A root whose exit the exit programs did not see (7.x can skip them: a preempted task holds
/// the program on its CPU) is seen by the daemon all the same, from its pidfd, and the tree dies
/// by its policy. The miss is made here the one way a test can: the root's entry is given
/// another start time, so that the exit programs take it for an earlier process's and leave it.
#[test]
fn a_root_exit_the_programs_miss_is_seen_from_its_pidfd() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let mut tree = LeashedTree::spawn(
        &mut host,
        "root-exit-unseen",
        "sh",
        &["-c", "sleep 600 & exec sleep 600"],
        &TreeOptions::default(),
    );
    tree.cgroup.settle_exactly(&["sleep", "sleep"]);
    let root = tree.root.id();
    let path = daemon.pins.join(format!(
        "v{}/maps/{}",
        leash_common::ABI_VERSION,
        map::MEMBERS
    ));
    let pinned = MapData::from_pin(&path).expect("opening the daemon's pinned member map");
    let mut members: HashMap<MapData, Pid, Member> =
        HashMap::try_from(Map::HashMap(pinned)).unwrap();
    let mut entry = members.get(&root, 0).expect("the root's entry");
    assert_eq!(entry.tree, tree.tree);
    entry.start_ns += 1_000_000_000;
    members.insert(root, entry, 0).unwrap();

    tree.root.kill().unwrap();
    let _ = tree.root.wait();
    let emptied = tree.cgroup.wait_empty(Duration::from_secs(10));
    assert!(
        emptied.is_some(),
        "the root's exit went unseen and its tree lives on: {:?}\n{}",
        tree.cgroup.procs(),
        daemon.log()
    );
    assert!(
        daemon
            .log()
            .contains("the kernel did not run the exit programs"),
        "the daemon says how it saw the exit:\n{}",
        daemon.log()
    );
}
