//! The rules, each on plain facts: who may register, see, kill and release what.

use super::*;

const HOST_NS: u32 = 4026531836;
const CONTAINER_NS: u32 = 4026532500;

/// alice (1000) registers her own process, in no tree, with room to spare.
fn alice_registers() -> RegisterFacts<'static> {
    RegisterFacts {
        requester: ProcessUids::all(1000),
        holder: 1000,
        target: ProcessUids::all(1000),
        confined_in: None,
        target_trees: &[],
        capacity_full: false,
    }
}

#[test]
fn a_user_registers_what_she_may_signal_under_a_lease_that_may_too() {
    assert_eq!(may_register(alice_registers()), Ok(()));
    let bobs = RegisterFacts {
        target: ProcessUids::all(1001),
        ..alice_registers()
    };
    assert_eq!(
        may_register(bobs),
        Err(RegisterDenied::RequesterMayNotSignal)
    );
    let by_root = RegisterFacts {
        requester: ProcessUids::all(0),
        ..bobs
    };
    assert_eq!(
        may_register(by_root),
        Err(RegisterDenied::HolderMayNotSignal),
        "root asks, but the tree would go under alice's lease"
    );
    let under_roots_lease = RegisterFacts {
        holder: 0,
        ..by_root
    };
    assert_eq!(may_register(under_roots_lease), Ok(()));
    let setuid_to_alice = RegisterFacts {
        target: ProcessUids {
            real: 1001,
            effective: 1001,
            saved: 1000,
        },
        ..alice_registers()
    };
    assert_eq!(
        may_register(setuid_to_alice),
        Ok(()),
        "kill(2) allows it: her uid is its saved one"
    );
}

#[test]
fn a_process_in_a_tree_registers_only_what_is_in_its_tree() {
    let from_the_agent = RegisterFacts {
        confined_in: Some(7),
        ..alice_registers()
    };
    assert_eq!(
        may_register(from_the_agent),
        Err(RegisterDenied::OutsideOwnTree(7)),
        "its host, or anything outside"
    );
    let in_its_tree = RegisterFacts {
        target_trees: &[7],
        ..from_the_agent
    };
    assert_eq!(may_register(in_its_tree), Ok(()));
    let nested_below = RegisterFacts {
        target_trees: &[9, 8, 7],
        ..from_the_agent
    };
    assert_eq!(may_register(nested_below), Ok(()));
    let in_the_tree_above = RegisterFacts {
        confined_in: Some(9),
        target_trees: &[7],
        ..alice_registers()
    };
    assert_eq!(
        may_register(in_the_tree_above),
        Err(RegisterDenied::OutsideOwnTree(9))
    );
}

#[test]
fn no_registration_past_the_daemons_capacity() {
    let full = RegisterFacts {
        capacity_full: true,
        ..alice_registers()
    };
    assert_eq!(may_register(full), Err(RegisterDenied::CapacityFull));
}

#[test]
fn a_container_sees_only_what_was_registered_from_it_or_below() {
    let host = Requester {
        uid: 1000,
        lease: 1,
        confined: &[],
        pid_namespace: HOST_NS,
        may_be_impersonated: false,
    };
    let container = Requester {
        lease: 2,
        pid_namespace: CONTAINER_NS,
        ..host
    };
    let sibling = Requester {
        lease: 3,
        pid_namespace: CONTAINER_NS + 1,
        ..host
    };
    let from_host = TreeFacts {
        lease: 1,
        owner_uid: 1000,
        chain: &[4],
        registered_from: &[HOST_NS],
    };
    let from_container = TreeFacts {
        lease: 2,
        chain: &[5],
        registered_from: &[CONTAINER_NS, HOST_NS],
        ..from_host
    };
    assert!(may_see(host, from_host) && may_see(host, from_container));
    assert!(may_see(container, from_container));
    assert!(!may_see(container, from_host), "the host's tree, same uid");
    assert!(
        !may_see(sibling, from_container),
        "another container's, same uid"
    );
    assert_eq!(may_kill(sibling, from_container), Verdict::Hidden);
    assert_eq!(may_release(container, from_host), Verdict::Hidden);
}

#[test]
fn a_member_cannot_loosen_its_tree_or_any_above_it() {
    // The agent runs in tree 5, nested in tree 2; it holds lease 9 (its own connection).
    let agent = Requester {
        uid: 1000,
        lease: 9,
        confined: &[5, 2],
        pid_namespace: HOST_NS,
        may_be_impersonated: false,
    };
    let own = TreeFacts {
        lease: 1,
        owner_uid: 1000,
        chain: &[5, 2],
        registered_from: &[HOST_NS],
    };
    let outer = TreeFacts {
        lease: 1,
        owner_uid: 1000,
        chain: &[2],
        registered_from: &[HOST_NS],
    };
    for tree in [own, outer] {
        assert!(matches!(
            may_release(agent, tree),
            Verdict::Denied(_) | Verdict::Hidden
        ));
        assert!(matches!(
            may_kill(agent, tree),
            Verdict::Denied(_) | Verdict::Hidden
        ));
    }
    // Even as root, and even holding the lease.
    let root_agent = Requester {
        uid: 0,
        lease: 1,
        ..agent
    };
    assert!(matches!(may_release(root_agent, own), Verdict::Denied(_)));
    assert_eq!(
        may_kill(root_agent, outer),
        Verdict::Hidden,
        "a member sees only its own tree and those nested in it"
    );
    // What it registered itself, nested below, is its own to release or kill.
    let its_own = TreeFacts {
        lease: 9,
        owner_uid: 1000,
        chain: &[7, 5, 2],
        registered_from: &[HOST_NS],
    };
    assert_eq!(may_release(agent, its_own), Verdict::Allowed);
    assert_eq!(may_kill(agent, its_own), Verdict::Allowed);
    // Another host's tree of the same uid is not even visible to it.
    let other = TreeFacts {
        lease: 3,
        owner_uid: 1000,
        chain: &[8],
        registered_from: &[HOST_NS],
    };
    assert_eq!(may_kill(agent, other), Verdict::Hidden);
    assert!(!may_see(agent, other));
}

#[test]
fn rights_belong_to_the_lease() {
    let tree = TreeFacts {
        lease: 1,
        owner_uid: 1000,
        chain: &[4],
        registered_from: &[HOST_NS],
    };
    let holder = Requester {
        uid: 1000,
        lease: 1,
        confined: &[],
        pid_namespace: HOST_NS,
        may_be_impersonated: false,
    };
    let terminal = Requester { lease: 2, ..holder };
    let root = Requester {
        uid: 0,
        lease: 3,
        confined: &[],
        pid_namespace: HOST_NS,
        may_be_impersonated: false,
    };
    let stranger = Requester {
        uid: 1001,
        lease: 4,
        confined: &[],
        pid_namespace: HOST_NS,
        may_be_impersonated: false,
    };
    assert_eq!(may_release(holder, tree), Verdict::Allowed);
    assert_eq!(may_release(root, tree), Verdict::Allowed);
    assert!(matches!(may_release(terminal, tree), Verdict::Denied(_)));
    assert_eq!(may_kill(terminal, tree), Verdict::Allowed);
    assert_eq!(may_kill(stranger, tree), Verdict::Hidden);
    assert_eq!(may_release(stranger, tree), Verdict::Hidden);
}

#[test]
fn a_client_another_may_speak_for_cannot_release() {
    let tree = TreeFacts {
        lease: 1,
        owner_uid: 61001,
        chain: &[4],
        registered_from: &[CONTAINER_NS, HOST_NS],
    };
    let host = Requester {
        uid: 61001,
        lease: 1,
        confined: &[],
        pid_namespace: CONTAINER_NS,
        may_be_impersonated: true,
    };
    assert!(matches!(may_release(host, tree), Verdict::Denied(_)));
    let as_root = Requester { uid: 0, ..host };
    assert!(matches!(may_release(as_root, tree), Verdict::Denied(_)));
    // A kill only tightens: its grace is at most the tree's own.
    assert_eq!(may_kill(host, tree), Verdict::Allowed);
    let told_apart = Requester {
        may_be_impersonated: false,
        ..host
    };
    assert_eq!(may_release(told_apart, tree), Verdict::Allowed);
}

fn uids(real: u32, effective: u32, saved: u32) -> ProcessUids {
    ProcessUids {
        real,
        effective,
        saved,
    }
}

#[test]
fn the_kill_rules() {
    let alice = uids(1000, 1000, 1000);
    assert!(may_signal(alice, alice));
    assert!(
        !may_signal(alice, uids(0, 0, 0)),
        "a user may not register root's process"
    );
    assert!(!may_signal(alice, uids(1001, 1001, 1001)));
    // A setuid program run by alice keeps alice as its real uid: she may signal it.
    assert!(may_signal(alice, uids(1000, 0, 0)));
    // A process that dropped to alice's uid but saved root's: real uid matches.
    assert!(may_signal(alice, uids(1000, 1000, 0)));
    // Alice's effective uid against a target whose saved uid is hers.
    assert!(may_signal(alice, uids(1001, 1001, 1000)));
    assert!(may_signal(uids(0, 0, 0), alice), "root may signal anyone");
}

#[test]
fn trees_belong_to_their_uid() {
    assert!(may_manage(1000, 1000));
    assert!(!may_manage(1000, 1001));
    assert!(may_manage(0, 1001));
}

#[test]
fn status_parsing() {
    let status = "Name:\tsleep\nUid:\t1000\t1001\t1002\t1003\nGid:\t0\t0\t0\t0\n";
    assert_eq!(ProcessUids::parse(status), Some(uids(1000, 1001, 1002)));
    assert_eq!(ProcessUids::parse("Name: x\n"), None);
    assert_eq!(ProcessUids::parse("Uid:\tx\t1\t2\n"), None);
    assert!(ProcessUids::of(std::process::id()).is_some());
}
