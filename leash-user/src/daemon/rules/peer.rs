//! Who is on the other end of a connection, as the kernel told the daemon when it connected.

use leash_common::{Account, TreeId};

use super::{auth::Requester, pid_numbering::PidNumbering};
use crate::{kernel::TrackerView, proc::ProcessRef};

/// Who is on the other end, as the kernel says.
#[derive(Clone, Copy, Debug)]
pub(in crate::daemon) struct Peer {
    pub uid: u32,
    /// Whom its trees and requests are charged to (see `identity`).
    pub account: Account,
    /// Its pid namespace (inode number): it sees the trees registered from it or below.
    pub pid_namespace: u32,
    /// The process that connected, the lease's host (its start time read before it was
    /// identified, and checked against it once its pidfd was open).
    pub process: ProcessRef,
    pub lease: u64,
    /// How the client numbers processes: every pid it is sent is its own number.
    pub numbering: PidNumbering,
    /// Another process could have sent a line in the client's name. The kernel names each
    /// line's sender (SCM_CREDENTIALS), but lets a sender name any pid of its pid namespace
    /// there if it holds CAP_SYS_ADMIN over the user namespace that owns that pid namespace:
    /// root of a rootless container, which may be the agent, and which the leaked socket or
    /// one it took then lets speak for its host. That owner cannot be read without ptrace
    /// rights over the client, so this is what the daemon can tell when the client connects:
    /// it runs in a pid namespace nested in the daemon's and in a user namespace other than
    /// the initial one, as in such a container.
    pub may_be_impersonated: bool,
}

impl Peer {
    /// The tree the client's process runs in, then each tree that one is nested in; empty
    /// when it runs in none. The trees it may never release or kill.
    pub(in crate::daemon) fn confinement(&self, view: &TrackerView) -> Vec<TreeId> {
        match view.member(self.process.pid) {
            // The start time tells the client's process from an earlier one by the same pid.
            Some(member) if self.process.is(&member) => view.enclosing(member.tree),
            _ => Vec::new(),
        }
    }

    /// The rules' view of the client, confined to `confined` (see [`Peer::confinement`]).
    pub(in crate::daemon) fn requester<'a>(&self, confined: &'a [TreeId]) -> Requester<'a> {
        Requester {
            uid: self.uid,
            lease: self.lease,
            confined,
            pid_namespace: self.pid_namespace,
            may_be_impersonated: self.may_be_impersonated,
        }
    }
}
