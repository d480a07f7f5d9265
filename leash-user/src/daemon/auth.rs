//! Who may do what. The daemon runs as root; its clients usually do not, and the agent inside a
//! tree runs under its host's uid, so a uid alone grants little:
//!
//! - register: only processes the client could signal itself (the kill(2) rule), and so could
//!   the uid holding the lease the tree goes under; from a process in a tree, only processes of
//!   that tree; and only while the daemon has room for another tree.
//! - release: the host holding the tree's lease, or root; never on a connection whose lines
//!   another process could have sent in the client's name (see `Peer::may_be_impersonated`):
//!   a release loosens a tree, and there the agent could be the one asking.
//! - kill: that host, root, or a process of the tree's uid that runs in no tree (a user at a
//!   terminal, who could signal the members anyway).
//! - see (list, events): a process in a tree sees its own tree and the trees nested in it;
//!   any other sees its uid's trees, root all; and only those registered from its own pid
//!   namespace or one nested in it (a container's trees are its own, whatever its uid).
//!
//! Above all of these: a process in a tree may never release or kill that tree, nor any tree it
//! is nested in, whoever it runs as. Whatever it registers is nested inside its own tree.

use std::fs;

use leash_common::{Pid, TreeId};

/// A process's user ids, from /proc/PID/status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProcessUids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
}

impl ProcessUids {
    /// One uid as all three, for a process known only by its uid.
    pub(super) fn all(uid: u32) -> Self {
        Self {
            real: uid,
            effective: uid,
            saved: uid,
        }
    }

    pub(super) fn of(pid: Pid) -> Option<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Self::parse(&status)
    }

    fn parse(status: &str) -> Option<Self> {
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        let mut ids = line.split_whitespace().map(str::parse::<u32>);
        Some(Self {
            real: ids.next()?.ok()?,
            effective: ids.next()?.ok()?,
            saved: ids.next()?.ok()?,
        })
    }
}

/// kill(2): a sender may signal a target if it is privileged, or if its real or effective uid
/// equals the target's real or saved uid.
pub(super) fn may_signal(sender: ProcessUids, target: ProcessUids) -> bool {
    sender.effective == 0
        || [sender.real, sender.effective]
            .iter()
            .any(|&uid| uid == target.real || uid == target.saved)
}

/// A registration, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RegisterFacts<'a> {
    /// The uids of the process that asks.
    pub requester: ProcessUids,
    /// The uid holding the lease the tree goes under: the requester's own, or another's whose
    /// token it gives.
    pub holder: u32,
    /// The uids of the process to register.
    pub target: ProcessUids,
    /// The tree the requesting process runs in (the innermost), if any.
    pub confined_in: Option<TreeId>,
    /// The tree the process to register is a member of, then each tree that one is nested
    /// in; empty when it is in none.
    pub target_trees: &'a [TreeId],
    /// Whether the daemon holds as many trees as it has room for.
    pub capacity_full: bool,
}

/// Why a registration is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RegisterDenied {
    /// The process that asks may not signal the process to register.
    RequesterMayNotSignal,
    /// The uid holding the lease may not.
    HolderMayNotSignal,
    /// The process that asks runs in this tree, and the process to register is not in it: its
    /// host, or any process outside, would otherwise come under the agent's tree, and the
    /// host's own kill and release of it would find nothing.
    OutsideOwnTree(TreeId),
    /// The daemon's tree capacity is full (a first look: the owner thread checks again as it
    /// makes the tree).
    CapacityFull,
}

/// Whether a registration may go ahead: the rules in the order they are told.
pub(super) fn may_register(facts: RegisterFacts<'_>) -> Result<(), RegisterDenied> {
    if !may_signal(facts.requester, facts.target) {
        return Err(RegisterDenied::RequesterMayNotSignal);
    }
    if !may_signal(ProcessUids::all(facts.holder), facts.target) {
        return Err(RegisterDenied::HolderMayNotSignal);
    }
    if let Some(own) = facts.confined_in
        && !facts.target_trees.contains(&own)
    {
        return Err(RegisterDenied::OutsideOwnTree(own));
    }
    if facts.capacity_full {
        return Err(RegisterDenied::CapacityFull);
    }
    Ok(())
}

/// Whether a client of `uid` may see, kill or release a tree owned by `owner`.
pub(super) fn may_manage(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

/// Who is asking.
#[derive(Clone, Copy, Debug)]
pub(super) struct Requester<'a> {
    pub uid: u32,
    pub lease: u64,
    /// The tree the requesting process runs in, then each tree that one is nested in; empty
    /// when it runs in none.
    pub confined: &'a [TreeId],
    /// The requesting process's pid namespace.
    pub pid_namespace: u32,
    /// Another process (a container's root) could have sent the request in the requester's
    /// name: see `Peer::may_be_impersonated`.
    pub may_be_impersonated: bool,
}

/// A tree, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct TreeFacts<'a> {
    pub lease: u64,
    pub owner: u32,
    /// The tree, then each tree it is nested in.
    pub chain: &'a [TreeId],
    /// The pid namespaces of the host that registered it, its own first.
    pub registered_from: &'a [u32],
}

/// What the rules say of a request on a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Allowed,
    /// The client may not even see the tree: it is reported as missing.
    Hidden,
    Denied(&'static str),
}

/// Whether the client may see the tree (list, events). Only a tree registered from its own
/// pid namespace or one nested in it: a container sees its own trees, never those of another
/// container of the same uid; the host's namespace sees them all.
pub(super) fn may_see(who: Requester<'_>, tree: TreeFacts<'_>) -> bool {
    if !tree.registered_from.contains(&who.pid_namespace) {
        return false;
    }
    match who.confined.first() {
        Some(own) => tree.chain.contains(own),
        None => may_manage(who.uid, tree.owner),
    }
}

fn holds_the_client(who: Requester<'_>, tree: TreeFacts<'_>) -> bool {
    tree.chain
        .first()
        .is_some_and(|tree| who.confined.contains(tree))
}

/// Whether the client may release the tree.
pub(super) fn may_release(who: Requester<'_>, tree: TreeFacts<'_>) -> Verdict {
    if !may_see(who, tree) {
        Verdict::Hidden
    } else if holds_the_client(who, tree) {
        Verdict::Denied("a process may not release the tree it runs in, nor one that holds it")
    } else if who.may_be_impersonated {
        Verdict::Denied(
            "a client in a user namespace and a pid namespace of its own (a rootless \
             container) may not release: root there can send a line in any process's name \
             (SCM_CREDENTIALS), the agent included; kill the tree instead, or release it as \
             root outside the container",
        )
    } else if who.lease == tree.lease || who.uid == 0 {
        Verdict::Allowed
    } else {
        Verdict::Denied("only the host holding the tree's lease, or root, may release it")
    }
}

/// Whether the client may kill the tree.
pub(super) fn may_kill(who: Requester<'_>, tree: TreeFacts<'_>) -> Verdict {
    if !may_see(who, tree) {
        Verdict::Hidden
    } else if holds_the_client(who, tree) {
        Verdict::Denied("a process may not kill the tree it runs in, nor one that holds it")
    } else if who.lease == tree.lease
        || who.uid == 0
        || (who.confined.is_empty() && who.uid == tree.owner)
    {
        Verdict::Allowed
    } else {
        Verdict::Denied(
            "only the host holding the tree's lease, root, or a process of its uid outside any \
             tree may kill it",
        )
    }
}

#[cfg(test)]
mod tests {
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
            owner: 1000,
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
            owner: 1000,
            chain: &[5, 2],
            registered_from: &[HOST_NS],
        };
        let outer = TreeFacts {
            lease: 1,
            owner: 1000,
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
            owner: 1000,
            chain: &[7, 5, 2],
            registered_from: &[HOST_NS],
        };
        assert_eq!(may_release(agent, its_own), Verdict::Allowed);
        assert_eq!(may_kill(agent, its_own), Verdict::Allowed);
        // Another host's tree of the same uid is not even visible to it.
        let other = TreeFacts {
            lease: 3,
            owner: 1000,
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
            owner: 1000,
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
            owner: 61001,
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
}
