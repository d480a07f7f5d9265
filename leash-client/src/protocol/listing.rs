//! What `list` answers: the trees, their members, and the leases that hold them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{LeaseId, RootExitPolicy, TreeId};

/// Where a tree is in its life, as `list` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TreeState {
    Live,
    /// A kill is under way.
    Killing,
    /// A kill gave up on members stuck in the kernel: the tree stays doomed, and another kill
    /// tries again.
    Unkillable,
}

impl TreeState {
    /// The word on the wire and in `leash ls`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Killing => "killing",
            Self::Unkillable => "unkillable",
        }
    }
}

impl fmt::Display for TreeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `list` with `leases` says: the trees, and the leases that hold them or have held one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub trees: Vec<TreeInfo>,
    #[serde(default)]
    pub leases: Vec<LeaseSummary>,
}

/// A lease that holds a tree or has held one, as `list` shows it: its host is shown while the
/// lease lasts, with trees or without.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseSummary {
    pub lease: LeaseId,
    /// The uid of the lease's host.
    pub owner_uid: u32,
    /// The host holding the lease, and what it runs (null once it is gone).
    pub host_pid: u32,
    pub host_comm: Option<String>,
    /// Trees the lease holds now.
    pub trees: u64,
}

/// A tree as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeInfo {
    pub tree: TreeId,
    pub lease: LeaseId,
    /// The uid of the lease's host.
    pub owner_uid: u32,
    pub root: u32,
    pub on_root_exit: RootExitPolicy,
    pub grace_ms: u64,
    /// The host holding the lease, and what it runs (null once it is gone).
    pub host_pid: u32,
    pub host_comm: Option<String>,
    pub root_exited: bool,
    pub state: TreeState,
    /// The tree this one is nested in (registered by or for one of its members), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested_in: Option<TreeId>,
    /// How many members the tree has; `members` lists at most [`MAX_LISTED_PER_TREE`] of them.
    #[serde(default)]
    pub member_count: u64,
    /// Some members are not listed (see `member_count`); list this tree alone to see more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub members_truncated: bool,
    /// CPU time (user and system, milliseconds) and resident memory (bytes) of the listed
    /// members, summed: of all members unless `members_truncated` (shared pages count once per
    /// member that maps them, as in `ps`). Absent from a daemon that does not read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    pub members: Vec<MemberInfo>,
}

/// Members a `list` reply shows of one tree, the oldest first: a reply's size is bounded
/// whatever the trees' sizes.
pub const MAX_LISTED_PER_TREE: usize = 1000;
/// Members a `list` reply shows in all (trees past it show their counts only).
pub const MAX_LISTED: usize = 2000;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub pid: u32,
    /// The process that forked it (for a registered process: its parent then).
    pub parent: u32,
    /// Start time, nanoseconds since boot.
    pub start_ns: u64,
    /// What it runs now; null if it is already gone.
    pub comm: Option<String>,
    /// The figures below are read from /proc as the reply is made, and are absent when the
    /// process is gone (or from a daemon that does not read them). Its effective uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Its state letter: R running, S sleeping, D disk wait, T stopped, Z zombie, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<char>,
    /// Its argv joined by spaces, at most [`MAX_CMDLINE_BYTES`] of it (cut there), decoded
    /// lossily, control characters as spaces; absent when it has none (a zombie, a kernel
    /// thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// CPU time used so far, user and system, by all its threads (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_ms: Option<u64>,
    /// Resident memory (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
}

/// Bytes of a member's command line that `list` reads: with the other fields, a member takes
/// at most about 1 KiB of a reply (each byte of it, if not UTF-8, becomes a 3-byte U+FFFD).
pub const MAX_CMDLINE_BYTES: usize = 256;
