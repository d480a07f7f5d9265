//! Adoption in steps, as a daemon drives it: the /proc search runs on another thread through a
//! shared view, and the tracker seeds what it found in short chunks. The tree ends exactly the
//! cgroup, as a one-call adoption makes it.

use std::{process::Child, thread};

use leash::kernel::{Adoption, TrackerView, identify};
use leash_common::Holder;
use leash_tests::{CHAIN, Cgroup, assert_tracks_cgroup, tracker};

/// Chunks this short make many seed calls, as a daemon that interleaves other work would.
const CHUNK: usize = 16;

/// Four chains of 50 under a root that becomes a sleep: 201 processes.
fn chains(cgroup: &Cgroup) -> Reaped {
    let script = r#"for i in 1 2 3 4; do sh -c "$0" "$0" 49 & done; exec sleep 600"#;
    let root = Reaped(
        cgroup
            .command("sh", &["-c", script, CHAIN])
            .spawn()
            .unwrap(),
    );
    cgroup.settle(201, &["sleep"]);
    root
}

fn search_elsewhere(view: &TrackerView, adoption: &Adoption) -> Vec<leash::proc::ProcessInfo> {
    let (tree, root) = (adoption.tree(), adoption.root());
    thread::scope(|s| {
        s.spawn(|| view.find_descendants(tree, root).expect("searching /proc"))
            .join()
            .expect("the searching thread")
            .found
    })
}

#[test]
fn an_adoption_driven_in_chunks_takes_the_whole_tree() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let view = tracker.shared_view().unwrap();
    let cgroup = Cgroup::new("adopt-steps");
    let root = chains(&cgroup);
    let (process, _pidfd) = identify(root.0.id()).unwrap();
    let mut adoption = tracker
        .start_adoption(process, None, Holder::default())
        .expect("starting the adoption");
    assert!(adoption.wants_pass(), "the root has children to find");
    assert_eq!(view.tree_status(adoption.tree()).unwrap().members, 1);
    let mut passes = Vec::new();
    while adoption.wants_pass() {
        let found = search_elsewhere(&view, &adoption);
        let mut new = 0;
        for chunk in found.chunks(CHUNK) {
            new += tracker.seed_found(adoption.tree(), chunk).unwrap();
        }
        passes.push((found.len(), new));
        adoption.end_pass(new).unwrap();
    }
    eprintln!("passes (found, new): {passes:?}");
    assert_eq!(
        passes[0],
        (200, 200),
        "the first pass finds every descendant"
    );
    assert_eq!(
        passes.last(),
        Some(&(0, 0)),
        "the last pass finds nothing: members are not found again"
    );
    assert_eq!(adoption.seeded(), 201);
    let tree = tracker.finish_adoption(adoption).unwrap();
    assert_eq!(tracker.tree_status(tree).unwrap().seeded, 201);
    assert_eq!(
        assert_tracks_cgroup(&tracker, tree, &cgroup, "adopted in chunks of 16"),
        201
    );
    drop(root);
}

#[test]
fn a_doomed_tree_takes_no_more_members_and_an_abandoned_one_is_released() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("adopt-steps-doomed");
    let root = chains(&cgroup);
    let (process, _pidfd) = identify(root.0.id()).unwrap();
    let adoption = tracker
        .start_adoption(process, None, Holder::default())
        .unwrap();
    let tree = adoption.tree();
    let found = tracker
        .find_descendants(tree, adoption.root())
        .unwrap()
        .found;
    assert_eq!(found.len(), 200);
    tracker.doom(tree).unwrap();
    let refused = tracker.seed_found(tree, &found);
    assert!(refused.is_err(), "seeded into a doomed tree: {refused:?}");
    assert_eq!(tracker.member_pids(tree).unwrap(), vec![root.0.id()]);
    tracker.abandon_adoption(adoption);
    assert!(tracker.trees().is_empty());
    assert_eq!(tracker.member(root.0.id()), None);
    drop(root);
}

#[test]
fn a_childless_root_needs_no_search() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("adopt-steps-childless");
    let root = Reaped(cgroup.command("sleep", &["600"]).spawn().unwrap());
    cgroup.settle(1, &["sleep"]);
    let (process, _pidfd) = identify(root.0.id()).unwrap();
    let adoption = tracker
        .start_adoption(process, None, Holder::default())
        .unwrap();
    assert!(!adoption.wants_pass());
    let tree = tracker.finish_adoption(adoption).unwrap();
    assert_eq!(
        assert_tracks_cgroup(&tracker, tree, &cgroup, "a childless root"),
        1
    );
    drop(root);
}

/// Kills and reaps the root however the test ends (the cgroup takes the rest).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
