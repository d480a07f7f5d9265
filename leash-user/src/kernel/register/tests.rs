//! The adoption's passes: when the search for descendants ends, and when it gives up.

use super::*;

fn searching() -> Adoption {
    Adoption {
        tree: 1,
        root: 100,
        enclosing: None,
        seeded: 1,
        passes: 0,
        searching: true,
        unsettled: false,
        found: 0,
        proc_reads: 0,
    }
}

#[test]
fn a_pass_that_finds_nothing_new_ends_the_search() {
    let mut adoption = searching();
    adoption.end_pass(20).unwrap();
    assert!(adoption.wants_pass());
    adoption.end_pass(0).unwrap();
    assert!(!adoption.wants_pass());
    assert_eq!(adoption.seeded(), 21);
}

#[test]
fn a_pass_that_read_a_member_unsteadily_proves_nothing() {
    let mut adoption = searching();
    let unsettled = WalkCounts {
        unsettled: 1,
        ..WalkCounts::default()
    };
    adoption.searched(&unsettled);
    adoption.end_pass(0).unwrap();
    assert!(
        adoption.wants_pass(),
        "another pass, though nothing was new"
    );
    adoption.searched(&WalkCounts::default());
    adoption.end_pass(0).unwrap();
    assert!(!adoption.wants_pass());
}

#[test]
fn a_tree_that_keeps_growing_fails_after_the_last_pass() {
    let mut adoption = searching();
    for _ in 1..MAX_SEED_PASSES {
        adoption.end_pass(1).unwrap();
    }
    assert!(adoption.end_pass(1).is_err());
    assert!(adoption.wants_pass(), "not finished: to be abandoned");
}
