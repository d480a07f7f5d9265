//! What the kernel side's maps hold, as user space reads them.

use leash_common::{Pid, TreeId};

use super::ptrace_guard::GuardChoice;

/// Map capacities, fixed when the programs are loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Processes tracked at once, over all trees. A child forked past it is still tracked (the
    /// map keeps a reserve beyond it: `leash_common::MEMBER_RESERVE`), its forker is killed,
    /// and it counts as a failed insert of its tree, which is killed as untrackable.
    pub members: u32,
    /// Trees registered at once.
    pub trees: u32,
    /// Bytes of the event ring buffer (a power of two, at least a page).
    pub event_bytes: u32,
    /// Members one non-root uid may have at once, over all its trees, so that no user can
    /// fill the map that every user's trees share. None: no limit. A fork beyond it gets the
    /// tree killed.
    pub members_per_uid: Option<u32>,
    /// Which ptrace guard to attach (see [`ptrace_guard`]).
    pub ptrace_guard: GuardChoice,
}

impl Capacity {
    /// The per-uid member quota when none is given: an eighth of the map.
    pub fn default_members_per_uid(members: u32) -> u32 {
        (members / 8).max(1)
    }
}

impl Default for Capacity {
    fn default() -> Self {
        let members = 131_072;
        Self {
            members,
            trees: 4096,
            event_bytes: 1 << 20,
            members_per_uid: Some(Self::default_members_per_uid(members)),
            ptrace_guard: GuardChoice::Auto,
        }
    }
}

/// One tracked process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub pid: Pid,
    /// The process that forked it (for a registered process: its parent at registration).
    pub parent: Pid,
    /// Start time, nanoseconds since boot (clock-tick resolution for registered processes).
    pub start_ns: u64,
    /// What the process is now (/proc/PID/comm), once [`fill_comms`] has read it; None before,
    /// or if it is gone.
    pub comm: Option<String>,
}

/// What the kernel knows about one tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeStatus {
    pub tree: TreeId,
    pub root: Pid,
    /// Members now: seeded + joined - left.
    pub members: u64,
    /// Put in by user space (the root, and descendants found in /proc at registration), less
    /// those it took out.
    pub seeded: i64,
    /// Joined at fork, in the kernel.
    pub joined: u64,
    /// Left at exit, in the kernel.
    pub left: u64,
    /// Children that could not be tracked because the member map was full.
    pub failed_inserts: u64,
    /// Forks made while the tree's owner had its whole member quota.
    pub over_quota: u64,
    /// When the root's thread group died (ns since boot), if it has.
    pub root_exit_ns: Option<u64>,
    /// When the tree was first doomed (ns since boot), if it has been.
    pub doomed_ns: Option<u64>,
    /// The tree it is nested in, if any.
    pub parent: Option<TreeId>,
}

/// Global counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub joins: u64,
    pub exits: u64,
    pub inserts_failed: u64,
    pub events_dropped: u64,
    /// Marked processes the reconciling iterator put into the member map: forks the fork
    /// programs missed (0 where the marks are not in place).
    pub reconciled: u64,
    /// Forks `task_alloc` refused: doomed trees' members', or children it could not mark.
    pub forks_refused: u64,
}

/// Where a pinned tracker's programs and maps came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Loaded and attached now, and pinned.
    Loaded,
    /// Taken over from the pins a previous daemon left: its programs never stopped.
    TakenOver,
}
