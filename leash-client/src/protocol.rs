//! The leash protocol: JSON lines over a Unix stream socket. docs/PROTOCOL.md describes it with
//! an example of every message; this module is its definition.
//!
//! A client sends [`Request`] lines; the daemon answers each with a [`ServerLine`] carrying the
//! same `id` and either `ok` or `error`, and, after `subscribe`, also sends `event` lines.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The version spoken here. A `hello` with another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;
/// The longest line either side accepts, newline included. A longer request gets a `too_long`
/// error and changes nothing.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// The longest line a client accepts from the daemon: a `list` reply is at most a few MiB (2000
/// members of about 1 KiB at most, and the trees).
pub const MAX_REPLY_BYTES: usize = 256 << 20;
/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/leash/leash.sock";
/// Overrides [`DEFAULT_SOCKET`] for the daemon and every client.
pub const SOCKET_ENV: &str = "LEASH_SOCKET";
/// The longest grace period a request may ask for.
pub const MAX_GRACE_MS: u64 = 10 * 60 * 1000;

/// The highest pid Linux can give (PID_MAX_LIMIT of a 64-bit kernel, the most `pid_max` may
/// be set to). A request that names a process by a higher number, or by 0, is a bad request.
pub const MAX_PID: u32 = 4 * 1024 * 1024;

pub type TreeId = u32;
pub type LeaseId = u64;

/// One request line: `{"id": 7, "op": "kill", "tree": 3, "grace_ms": 500}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the client; echoed in the reply.
    pub id: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Checks the protocol version and returns this connection's lease.
    Hello { protocol: u32 },
    /// Makes `pid` (with its existing descendants) the root of a new tree. The tree belongs to
    /// this connection's lease, or to the lease whose token is given (the `leash exec` shim).
    Register {
        /// The process, as the daemon's pid namespace numbers it; absent: the client itself,
        /// or the process of the pidfd sent with this line (`pidfd`).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "pid_in_range"
        )]
        pid: Option<u32>,
        /// The process is named by a pidfd attached to this request's line (SCM_RIGHTS): right
        /// in any pid namespace, as a number is not.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pidfd: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on_root_exit: Option<RootExitPolicy>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
    /// Stops enforcing a tree: its processes are left alone from now on.
    Release { tree: TreeId },
    /// Kills a tree; the reply comes when it is empty.
    Kill {
        tree: TreeId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_ms: Option<u64>,
    },
    /// The trees this client may see (only `tree`, if given), with their members: at most
    /// [`MAX_LISTED_PER_TREE`] of each, the oldest first, and [`MAX_LISTED`] in all. With
    /// `leases`, the reply is a [`Listing`]: the trees and the leases that hold or held them,
    /// so a host whose trees are gone is still shown (a daemon without it ignores the field and
    /// answers with the trees alone).
    List {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tree: Option<TreeId>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        leases: bool,
    },
    /// From now on, send tree events on this connection.
    Subscribe,
    /// The daemon's state: version, programs, capacity and fill, events dropped.
    Status,
}

/// A `pid` field: a number from 1 to [`MAX_PID`], or null. Out of range, it is refused as the
/// line is read (`bad_request`, like any ill-typed field), rather than reaching the kernel as a
/// pid no process can have (4294967295 does not fit a `pid_t`).
fn pid_in_range<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    let pid = Option::<u32>::deserialize(deserializer)?;
    match pid {
        Some(number) if number == 0 || number > MAX_PID => Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Unsigned(number.into()),
            &"a pid, from 1 to 4194304",
        )),
        pid => Ok(pid),
    }
}

/// What happens to the rest of a tree when its root exits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootExitPolicy {
    /// Kill the remaining members (the default).
    #[default]
    Kill,
    /// Leave them running; the tree is still killed when its lease ends.
    Keep,
}

impl RootExitPolicy {
    /// The word on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Keep => "keep",
        }
    }
}

/// Every line the daemon sends: a reply to a request (`id` with `ok`), an error (`id`, null when
/// the request was too broken to have one, with `error`), or an `event`. Untagged: the JSON is
/// the three shapes alone, and a client matches on what it got instead of checking fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerLine {
    Reply {
        id: u64,
        ok: Reply,
    },
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        error: ErrorBody,
    },
    Event {
        event: Event,
    },
}

impl ServerLine {
    pub fn ok(id: u64, reply: Reply) -> Self {
        Self::Reply { id, ok: reply }
    }

    pub fn error(id: Option<u64>, code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Error {
            id,
            error: ErrorBody {
                code,
                message: message.into(),
            },
        }
    }

    pub fn event(event: Event) -> Self {
        Self::Event { event }
    }

    /// The request this line answers, if it answers one.
    pub fn id(&self) -> Option<u64> {
        match self {
            Self::Reply { id, .. } => Some(*id),
            Self::Error { id, .. } => *id,
            Self::Event { .. } => None,
        }
    }

    /// The error, if this line is one.
    pub fn error_body(&self) -> Option<&ErrorBody> {
        match self {
            Self::Error { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A successful reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Hello {
        protocol: u32,
        daemon_version: String,
        lease: LeaseInfo,
    },
    Registered {
        tree: TreeId,
        root: u32,
        /// Members at registration: the root and the descendants it already had.
        members: u64,
    },
    Released {
        tree: TreeId,
    },
    Killed(KillSummary),
    Trees(Vec<TreeInfo>),
    /// `list` with `leases`.
    Listing(Listing),
    Subscribed,
    Status(StatusInfo),
}

/// What `status` says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusInfo {
    pub daemon_version: String,
    pub protocol: u32,
    /// The attached programs: `name (attach point)`.
    pub programs: Vec<String>,
    /// Processes the member map can hold, and holds now (all trees).
    pub member_capacity: u32,
    pub members: u64,
    /// Trees the daemon can hold, and holds now (all trees).
    pub tree_capacity: u32,
    pub trees: u64,
    /// Leases (connections) now, hosts' and others' (viewers', probes', this one); for a
    /// non-root client, its uid's only.
    pub leases: u64,
    /// Of those, hosts' leases: those that registered a tree (the others only ask).
    #[serde(default)]
    pub host_leases: u64,
    /// Kernel events that did not fit in the ring buffer since the programs were loaded.
    pub events_dropped: u64,
    /// Children that could not be tracked because the member map was full.
    pub inserts_failed: u64,
    /// The membership guarantee in place: `marks` (exact: an LSM program the kernel never
    /// skips marks every member's child) or `layered` (the fork programs alone, which Linux 7.x
    /// can skip). Absent from daemons that do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<String>,
    /// Where the programs and maps are pinned (tracking goes on if the daemon dies); absent
    /// when they are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_at: Option<String>,
    /// Pins that should be there and are not (removed by hand, or by something that took them
    /// for its own): tracking then ends with the daemon after all. Absent when none is missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins_missing: Vec<String>,
}

/// The lease of a connection. The token lets another process (the `leash exec` shim) register
/// itself under this lease; keep it as secret as the processes it can bind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    pub id: LeaseId,
    pub token: String,
}

/// How a kill went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KillSummary {
    pub tree: TreeId,
    /// Members sent SIGTERM, those of the trees nested in it included.
    pub terminated: u64,
    /// SIGKILLs sent, over all rounds, those to the nested trees' members included.
    pub killed: u64,
    pub rounds: u32,
    /// From the start of the kill to an empty tree.
    pub elapsed_ms: u64,
    /// Why the tree was killed.
    pub reason: KillReason,
}

/// Why a tree was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KillReason {
    /// A client with the right asked (`kill`).
    Request,
    /// Its root exited, and its policy is `kill`.
    RootExited,
    /// Its lease ended: the host exited or its connection closed.
    LeaseEnded,
    /// The tree it is nested in was killed.
    EnclosingKilled,
    /// It forked past its owner's member quota (fail closed).
    MemberQuota,
    /// A child could not be tracked: the member map was full (fail closed).
    Untrackable,
    /// A kill under way when the previous daemon stopped, finished by this one.
    Resumed,
    /// The daemon is shutting down (SIGTERM), not handing over.
    Shutdown,
}

impl KillReason {
    /// Every reason, in the order above.
    pub const ALL: [KillReason; 8] = [
        Self::Request,
        Self::RootExited,
        Self::LeaseEnded,
        Self::EnclosingKilled,
        Self::MemberQuota,
        Self::Untrackable,
        Self::Resumed,
        Self::Shutdown,
    ];

    /// The word on the wire, in logs and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Request => "request",
            Self::RootExited => "root_exited",
            Self::LeaseEnded => "lease_ended",
            Self::EnclosingKilled => "enclosing_killed",
            Self::MemberQuota => "member_quota",
            Self::Untrackable => "untrackable",
            Self::Resumed => "resumed",
            Self::Shutdown => "shutdown",
        }
    }
}

impl fmt::Display for KillReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Something that happened to a tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub kind: EventKind,
    pub tree: TreeId,
    pub lease: LeaseId,
    /// The process concerned (the root for `root_exited`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// For `fork`: the process that forked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    /// For `fork`, `exec`, `exit`: the command name (the forker's for a fork).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// For `dropped`: how many events this subscriber missed because it read too slowly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// For `tree_empty`: the kill's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill: Option<KillSummary>,
    /// For `kill_started`: why, a [`KillReason`] word. For `kill_failed`: what failed, in words.
    /// For `closing`: why the daemon closes the connection, a [`ClosingReason`] word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `refused`: the error code that refused the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// For `refused`: the request's line, its first [`MAX_QUOTED_BYTES`] at most (cut at a
    /// character boundary, invalid UTF-8 replaced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
}

impl Event {
    /// An event of `kind` about `tree` of `lease`, concerning process `pid` if any; the fields
    /// of particular kinds are set after.
    pub fn new(kind: EventKind, tree: TreeId, lease: LeaseId, pid: Option<u32>) -> Self {
        Self {
            kind,
            tree,
            lease,
            pid,
            parent: None,
            comm: None,
            count: None,
            kill: None,
            reason: None,
            code: None,
            line: None,
        }
    }

    /// The last line the daemon sends before it closes the connection of `lease` itself.
    pub fn closing(lease: LeaseId, reason: ClosingReason) -> Self {
        let mut event = Self::new(EventKind::Closing, 0, lease, None);
        event.reason = Some(reason.as_str().to_owned());
        event
    }

    /// A request that process `pid` (not the lease's host) sent on `lease`'s connection was
    /// refused with `code`; `line` is the request, of which the first [`MAX_QUOTED_BYTES`] are
    /// kept.
    pub fn refused(lease: LeaseId, pid: u32, code: ErrorCode, line: &[u8]) -> Self {
        let mut event = Self::new(EventKind::Refused, 0, lease, Some(pid));
        event.code = Some(code);
        event.line = Some(quote_line(line));
        event
    }

    /// Why the daemon closed this connection, if this is a `closing` event with a reason it
    /// knows.
    pub fn closing_reason(&self) -> Option<ClosingReason> {
        if self.kind != EventKind::Closing {
            return None;
        }
        let reason = self.reason.as_deref()?;
        ClosingReason::ALL
            .into_iter()
            .find(|known| known.as_str() == reason)
    }
}

/// The most bytes of a request line a `refused` event quotes.
pub const MAX_QUOTED_BYTES: usize = 200;

/// The first [`MAX_QUOTED_BYTES`] of `line` at most, cut at a UTF-8 character boundary (a
/// character cut in two is left out whole), invalid UTF-8 replaced.
pub fn quote_line(line: &[u8]) -> String {
    let mut end = line.len().min(MAX_QUOTED_BYTES);
    if end < line.len() {
        // A continuation byte (10xxxxxx) at the cut: the character it belongs to started
        // before it, and goes.
        while end > 0 && line[end] & 0b1100_0000 == 0b1000_0000 {
            end -= 1;
        }
    }
    String::from_utf8_lossy(&line[..end]).into_owned()
}

/// Why the daemon closes a connection itself (the `closing` event's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosingReason {
    /// The daemon is stopping and kills every tree: this lease's trees are killed (kill
    /// reason `shutdown`).
    Shutdown,
    /// The daemon is stopping and leaves its trees to the next daemon (a hand-over): this
    /// lease's trees stay enforced, by the daemon that takes over; they are no longer tied to
    /// this connection, and a new connection is a new lease.
    HandOver,
    /// The client left more than 128 KiB of replies unread: its lease ends, and its trees are
    /// killed as when any connection closes.
    NotReading,
}

impl ClosingReason {
    /// Every reason, in the order above.
    pub const ALL: [ClosingReason; 3] = [Self::Shutdown, Self::HandOver, Self::NotReading];

    /// The word on the wire and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shutdown => "shutdown",
            Self::HandOver => "hand_over",
            Self::NotReading => "not_reading",
        }
    }

    /// What became of the lease's trees, in words, for an error or a message once the
    /// connection has ended.
    pub fn outcome(self) -> &'static str {
        match self {
            Self::Shutdown => "the leash daemon stopped (shutdown): it killed this lease's trees",
            Self::HandOver => {
                "the leash daemon handed its trees over to the next daemon: they stay enforced; \
                 a new connection is a new lease"
            }
            Self::NotReading => {
                "the leash daemon closed the connection because its replies went unread (more \
                 than 128 KiB): the lease ended, and the daemon kills its trees"
            }
        }
    }
}

impl fmt::Display for ClosingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Registered,
    RootExited,
    KillStarted,
    TreeEmpty,
    Released,
    /// A member forked a new member.
    Fork,
    /// A member executed a new program.
    Exec,
    /// A member's last thread exited.
    Exit,
    /// This subscriber fell behind and missed `count` events (tree and lease are 0).
    Dropped,
    /// A kill gave up: `reason` says why (members stuck in the kernel). The tree stays doomed.
    KillFailed,
    /// The last line before the daemon closes this connection itself: `reason` says why (a
    /// [`ClosingReason`] word) and so what becomes of the lease's trees. Sent whether or not
    /// the connection subscribed; tree is 0.
    Closing,
    /// A request another process (not the host that opened the lease) sent on this connection
    /// was refused: `pid` sent it (0 if the host cannot see it), `code` refused it, `line` is
    /// its start. The lease goes on. Sent whether or not the connection subscribed; tree is 0.
    Refused,
}

impl EventKind {
    /// Every kind, in the order above: the host libraries list the same words (a test checks).
    pub const ALL: [EventKind; 12] = [
        Self::Registered,
        Self::RootExited,
        Self::KillStarted,
        Self::TreeEmpty,
        Self::Released,
        Self::Fork,
        Self::Exec,
        Self::Exit,
        Self::Dropped,
        Self::KillFailed,
        Self::Closing,
        Self::Refused,
    ];
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// What `leash exec --status-fd M` tells its host on descriptor M, one JSON line each:
/// `Registered` before the command runs, or `Refused` (the command never runs); then
/// `ExecFailed` if the command could not be executed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecReport {
    Registered {
        root: u32,
        tree: TreeId,
    },
    #[serde(rename = "error")]
    Refused {
        /// The daemon's [`ErrorCode`], `unavailable` (no daemon at the socket) or `failed`.
        code: String,
        message: String,
    },
    ExecFailed {
        errno: Option<i32>,
        message: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not an object, an unknown op, a missing or ill-typed field, a value out of range.
    BadRequest,
    /// The line is longer than [`MAX_LINE_BYTES`].
    TooLong,
    /// `hello` with a protocol version this daemon does not speak.
    UnsupportedVersion,
    /// No such tree, process or lease (or not one this client may see).
    NotFound,
    /// The kill(2) rules do not let this client signal that process.
    PermissionDenied,
    /// A limit is reached: trees per uid, or the daemon's capacity.
    LimitReached,
    /// A kill could not empty the tree (members stuck in the kernel); it stays doomed.
    KillFailed,
    /// The daemon failed; the message says how.
    Internal,
}

impl ErrorCode {
    /// Every code, in the order above.
    pub const ALL: [ErrorCode; 8] = [
        Self::BadRequest,
        Self::TooLong,
        Self::UnsupportedVersion,
        Self::NotFound,
        Self::PermissionDenied,
        Self::LimitReached,
        Self::KillFailed,
        Self::Internal,
    ];
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_value(self).ok();
        write!(
            f,
            "{}",
            text.as_ref().and_then(|v| v.as_str()).unwrap_or("error")
        )
    }
}

/// Why a request line could not be decoded: becomes a `bad_request` error reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// The line's `id`, when it has a usable one, so the reply can name the request.
    pub id: Option<u64>,
    pub message: String,
}

impl DecodeError {
    /// The reply the daemon sends for this line.
    pub fn reply(&self) -> ServerLine {
        ServerLine::error(self.id, ErrorCode::BadRequest, self.message.clone())
    }
}

/// Decodes one request line (without its newline), as the daemon does with every line a client
/// sends. Any bytes at all may come in; the result is a request or an error that still carries
/// the `id` when the line is a JSON object with a usable one.
pub fn decode_request(line: &[u8]) -> Result<Request, DecodeError> {
    // Through a Value first: a line that is JSON but not a valid request still has its id read.
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| DecodeError {
        id: None,
        message: format!("not JSON: {e}"),
    })?;
    let id = value.get("id").and_then(serde_json::Value::as_u64);
    serde_json::from_value(value).map_err(|e| DecodeError {
        id,
        message: e.to_string(),
    })
}

/// The socket path: `LEASH_SOCKET` if set, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> std::path::PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| DEFAULT_SOCKET.into(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip_request(line: &str) -> Request {
        let request: Request = serde_json::from_str(line).unwrap();
        let again: Request =
            serde_json::from_str(&serde_json::to_string(&request).unwrap()).unwrap();
        assert_eq!(request, again);
        request
    }

    #[test]
    fn requests_parse_as_documented() {
        assert_eq!(
            round_trip_request(r#"{"id":1,"op":"hello","protocol":1}"#).op,
            Op::Hello { protocol: 1 }
        );
        assert_eq!(
            round_trip_request(
                r#"{"id":2,"op":"register","pid":42,"on_root_exit":"keep","grace_ms":0}"#
            )
            .op,
            Op::Register {
                pid: Some(42),
                pidfd: false,
                lease: None,
                on_root_exit: Some(RootExitPolicy::Keep),
                grace_ms: Some(0)
            }
        );
        assert_eq!(
            round_trip_request(r#"{"id":3,"op":"kill","tree":5}"#).op,
            Op::Kill {
                tree: 5,
                grace_ms: None
            }
        );
        assert_eq!(
            round_trip_request(r#"{"id":4,"op":"list"}"#).op,
            Op::List {
                tree: None,
                leases: false
            }
        );
        assert_eq!(
            round_trip_request(r#"{"id":4,"op":"list","tree":3}"#).op,
            Op::List {
                tree: Some(3),
                leases: false
            }
        );
        assert_eq!(
            round_trip_request(r#"{"id":4,"op":"list","leases":true}"#).op,
            Op::List {
                tree: None,
                leases: true
            }
        );
    }

    #[test]
    fn bad_requests_are_errors() {
        for line in [
            r#"{"id":1,"op":"reboot"}"#,
            r#"{"id":1}"#,
            r#"{"id":1,"op":"kill"}"#,
            r#"{"id":1,"op":"kill","tree":-1}"#,
            r#"{"id":1,"op":"register","pid":"x"}"#,
            r#"[1,2,3]"#,
            "not json",
        ] {
            assert!(serde_json::from_str::<Request>(line).is_err(), "{line}");
        }
    }

    #[test]
    fn decoding_keeps_the_id_of_a_bad_request() {
        assert_eq!(
            decode_request(br#"{"id":4,"op":"list"}"#),
            Ok(Request {
                id: 4,
                op: Op::List {
                    tree: None,
                    leases: false
                }
            })
        );
        let error = decode_request(br#"{"id":7,"op":"reboot"}"#).unwrap_err();
        assert_eq!(error.id, Some(7));
        assert!(error.message.contains("reboot"), "{}", error.message);
        for line in [
            &b"not json"[..],
            br#"{"id":-1,"op":"list"}"#,
            br#"{"id":"7","op":"list"}"#,
            br#"[{"id":7}]"#,
            b"{\"id\":7,\"op\":\"list\"}\xff",
            b"",
        ] {
            let error = decode_request(line).unwrap_err();
            assert_eq!(error.id, None, "{}", String::from_utf8_lossy(line));
        }
        assert!(
            decode_request(b"not json")
                .unwrap_err()
                .message
                .starts_with("not JSON: ")
        );
        for out_of_range in [0, MAX_PID + 1, i32::MAX as u32 + 1, u32::MAX] {
            let line = format!(r#"{{"id":8,"op":"register","pid":{out_of_range}}}"#);
            let error = decode_request(line.as_bytes()).unwrap_err();
            assert_eq!(error.id, Some(8), "{line}");
            assert!(
                error.message.contains("a pid, from 1 to"),
                "{}",
                error.message
            );
        }
        for (line, expected) in [
            (r#"{"id":8,"op":"register","pid":4194304}"#, Some(MAX_PID)),
            (r#"{"id":8,"op":"register","pid":null,"pidfd":true}"#, None),
            (r#"{"id":8,"op":"register","pidfd":true}"#, None),
        ] {
            let decoded = decode_request(line.as_bytes()).unwrap();
            assert!(
                matches!(decoded.op, Op::Register { pid, .. } if pid == expected),
                "{line}"
            );
        }
        let reply = decode_request(br#"{"id":9}"#).unwrap_err().reply();
        assert_eq!(reply.id(), Some(9));
        assert_eq!(reply.error_body().unwrap().code, ErrorCode::BadRequest);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(decode_request(deep.as_bytes()).unwrap_err().id, None);
        let deep_id = format!(
            r#"{{"id":1,"op":"list","x":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        assert!(decode_request(deep_id.as_bytes()).is_err());
    }

    #[test]
    fn a_quoted_line_is_cut_at_a_character_boundary() {
        assert_eq!(quote_line(b"short"), "short");
        let long = "x".repeat(MAX_QUOTED_BYTES + 50);
        assert_eq!(quote_line(long.as_bytes()).len(), MAX_QUOTED_BYTES);
        // "é" is two bytes: one straddling the cut goes whole.
        let straddling = format!("{}é", "x".repeat(MAX_QUOTED_BYTES - 1));
        assert_eq!(
            quote_line(straddling.as_bytes()),
            "x".repeat(MAX_QUOTED_BYTES - 1)
        );
        let fits = format!("{}é", "x".repeat(MAX_QUOTED_BYTES - 2));
        assert_eq!(quote_line(fits.as_bytes()), fits);
        assert_eq!(quote_line(b"a\xffb"), "a\u{fffd}b");
    }

    #[test]
    fn a_closing_event_says_its_reason() {
        for reason in ClosingReason::ALL {
            let event = Event::closing(7, reason);
            assert_eq!(event.closing_reason(), Some(reason));
            let line = serde_json::to_string(&ServerLine::event(event)).unwrap();
            let again: ServerLine = serde_json::from_str(&line).unwrap();
            let ServerLine::Event { event } = again else {
                panic!("{line}")
            };
            assert_eq!(event.closing_reason(), Some(reason));
        }
        let mut unknown = Event::closing(7, ClosingReason::Shutdown);
        unknown.reason = Some("moon_phase".into());
        assert_eq!(unknown.closing_reason(), None);
        assert_eq!(
            Event::new(EventKind::Exit, 1, 7, Some(3)).closing_reason(),
            None
        );
    }

    #[test]
    fn server_lines_say_only_what_they_carry() {
        let line = serde_json::to_string(&ServerLine::ok(3, Reply::Released { tree: 9 })).unwrap();
        assert_eq!(line, r#"{"id":3,"ok":{"released":{"tree":9}}}"#);
        let line =
            serde_json::to_string(&ServerLine::error(None, ErrorCode::TooLong, "x")).unwrap();
        assert_eq!(line, r#"{"error":{"code":"too_long","message":"x"}}"#);
        assert_eq!(ErrorCode::PermissionDenied.to_string(), "permission_denied");
    }

    /// Every example in docs/PROTOCOL.md is a message of this module, written exactly as the
    /// daemon writes it: the document cannot drift from the code.
    /// The words of the enums that have an `as_str` are their wire words: logs, metrics labels
    /// and `leash ls` say what the protocol says.
    #[test]
    fn enum_words_are_their_wire_words() {
        let wire = |value: serde_json::Value| value.as_str().unwrap().to_owned();
        for reason in KillReason::ALL {
            assert_eq!(wire(serde_json::to_value(reason).unwrap()), reason.as_str());
        }
        for state in [TreeState::Live, TreeState::Killing, TreeState::Unkillable] {
            assert_eq!(wire(serde_json::to_value(state).unwrap()), state.as_str());
        }
        for policy in [RootExitPolicy::Kill, RootExitPolicy::Keep] {
            assert_eq!(wire(serde_json::to_value(policy).unwrap()), policy.as_str());
        }
        for reason in ClosingReason::ALL {
            assert_eq!(wire(serde_json::to_value(reason).unwrap()), reason.as_str());
        }
    }

    #[test]
    fn the_documented_examples_are_exact() {
        let doc = include_str!("../../docs/PROTOCOL.md");
        let mut in_json = false;
        let mut checked = 0;
        for line in doc.lines() {
            match line.trim() {
                "```json" => in_json = true,
                "```" => in_json = false,
                example if in_json => {
                    let again = if example.contains(r#""op":"#) {
                        let request: Request = serde_json::from_str(example)
                            .unwrap_or_else(|e| panic!("{example}: {e}"));
                        serde_json::to_string(&request).unwrap()
                    } else {
                        // A line of the daemon's, or else a report of the exec shim's.
                        let reply = serde_json::from_str::<ServerLine>(example)
                            .ok()
                            .map(|reply| serde_json::to_string(&reply).unwrap())
                            .filter(|reply| reply == example);
                        if let Some(reply) = reply {
                            reply
                        } else {
                            let report: ExecReport = serde_json::from_str(example)
                                .unwrap_or_else(|e| panic!("{example}: {e}"));
                            serde_json::to_string(&report).unwrap()
                        }
                    };
                    assert_eq!(again, example);
                    checked += 1;
                }
                _ => {}
            }
        }
        assert!(checked >= 25, "only {checked} examples found");
    }
}
