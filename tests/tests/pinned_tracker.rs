//! Pinned tracking outlives the process that pinned it: a tracker that is dropped (as a daemon
//! that dies) leaves its programs following forks into the pinned maps, and the next one takes
//! the pins over with every tree and member. Pins left incomplete are replaced.

use std::{fs, path::PathBuf, process::Command, time::Duration};

use leash::kernel::Origin;
use leash_tests::{Removed, Scenario, assert_tracks_cgroup, load_pinned_tracker};

#[test]
fn the_next_tracker_takes_over_every_tree_and_what_forked_meanwhile() {
    let root = Removed(PathBuf::from(format!(
        "/sys/fs/bpf/leash-test-{}-tracker",
        std::process::id()
    )));
    // The first load mounts bpffs if needed; then leave the pins half made, as a process that
    // died while pinning would.
    let Some((mut first, origin)) = load_pinned_tracker(&root.0) else {
        return;
    };
    assert_eq!(origin, Origin::Loaded);
    first.unpin().unwrap();
    drop(first);
    fs::create_dir_all(root.0.join(format!("v{}/maps", leash_common::ABI_VERSION))).unwrap();

    let (mut tracker, origin) = load_pinned_tracker(&root.0).unwrap();
    assert_eq!(
        origin,
        Origin::Loaded,
        "incomplete pins are replaced, not taken over"
    );
    let fifo = Removed(PathBuf::from(format!(
        "/tmp/leash-test-{}-go",
        std::process::id()
    )));
    assert!(
        Command::new("mkfifo")
            .arg(&fifo.0)
            .status()
            .unwrap()
            .success()
    );
    let script = format!(
        "sleep 600 & read line < {}; setsid sleep 601 & wait",
        fifo.0.display()
    );
    let scenario = Scenario::spawn(&mut tracker, "pinned", "sh", &["-c", &script]);
    scenario.cgroup.settle_exactly(&["sh", "sleep"]);

    // The tracker goes away; its pinned programs do not.
    drop(tracker);
    fs::write(&fifo.0, "go\n").unwrap();
    scenario.cgroup.settle_exactly(&["sh", "sleep", "sleep"]);

    let (mut next, origin) = load_pinned_tracker(&root.0).unwrap();
    assert_eq!(origin, Origin::TakenOver);
    assert_eq!(next.trees(), vec![scenario.tree]);
    assert_tracks_cgroup(&next, scenario.tree, &scenario.cgroup, "taken over");
    next.kill(scenario.tree, Duration::ZERO).unwrap();
    assert!(scenario.cgroup.procs().is_empty());
    next.unpin().unwrap();
    assert!(
        !root.0.exists(),
        "unpinned, and the pins' root (empty then) removed"
    );
}
