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
pub(in crate::daemon) struct ProcessUids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
}

impl ProcessUids {
    /// One uid as all three, for a process known only by its uid.
    pub(in crate::daemon) fn all(uid: u32) -> Self {
        Self {
            real: uid,
            effective: uid,
            saved: uid,
        }
    }

    pub(in crate::daemon) fn of(pid: Pid) -> Option<Self> {
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
pub(in crate::daemon) fn may_signal(sender: ProcessUids, target: ProcessUids) -> bool {
    sender.effective == 0
        || [sender.real, sender.effective]
            .iter()
            .any(|&uid| uid == target.real || uid == target.saved)
}

/// A registration, as the rules see it.
#[derive(Clone, Copy, Debug)]
pub(in crate::daemon) struct RegisterFacts<'a> {
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
pub(in crate::daemon) enum RegisterDenied {
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
pub(in crate::daemon) fn may_register(facts: RegisterFacts<'_>) -> Result<(), RegisterDenied> {
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

/// Whether a client of `uid` may see, kill or release a tree whose owner_uid is `owner_uid`.
pub(in crate::daemon) fn may_manage(uid: u32, owner_uid: u32) -> bool {
    uid == 0 || uid == owner_uid
}

/// Who is asking.
#[derive(Clone, Copy, Debug)]
pub(in crate::daemon) struct Requester<'a> {
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
pub(in crate::daemon) struct TreeFacts<'a> {
    pub lease: u64,
    pub owner_uid: u32,
    /// The tree, then each tree it is nested in.
    pub chain: &'a [TreeId],
    /// The pid namespaces of the host that registered it, its own first.
    pub registered_from: &'a [u32],
}

/// What the rules say of a request on a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::daemon) enum Verdict {
    Allowed,
    /// The client may not even see the tree: it is reported as missing.
    Hidden,
    Denied(&'static str),
}

/// Whether the client may see the tree (list, events). Only a tree registered from its own
/// pid namespace or one nested in it: a container sees its own trees, never those of another
/// container of the same uid; the host's namespace sees them all.
pub(in crate::daemon) fn may_see(who: Requester<'_>, tree: TreeFacts<'_>) -> bool {
    if !tree.registered_from.contains(&who.pid_namespace) {
        return false;
    }
    match who.confined.first() {
        Some(own) => tree.chain.contains(own),
        None => may_manage(who.uid, tree.owner_uid),
    }
}

fn holds_the_client(who: Requester<'_>, tree: TreeFacts<'_>) -> bool {
    tree.chain
        .first()
        .is_some_and(|tree| who.confined.contains(tree))
}

/// Whether the client may release the tree.
pub(in crate::daemon) fn may_release(who: Requester<'_>, tree: TreeFacts<'_>) -> Verdict {
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
pub(in crate::daemon) fn may_kill(who: Requester<'_>, tree: TreeFacts<'_>) -> Verdict {
    if !may_see(who, tree) {
        Verdict::Hidden
    } else if holds_the_client(who, tree) {
        Verdict::Denied("a process may not kill the tree it runs in, nor one that holds it")
    } else if who.lease == tree.lease
        || who.uid == 0
        || (who.confined.is_empty() && who.uid == tree.owner_uid)
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
mod tests;
