//! The leash protocol: JSON lines over a Unix stream socket. docs/PROTOCOL.md describes it with
//! an example of every message; this module is its definition.
//!
//! A client sends [`Request`] lines; the daemon answers each with a [`ServerLine`] carrying the
//! same `id` and either `ok` or `error`, and, after `subscribe`, also sends `event` lines.
//! What `list` answers (listing.rs) and the events (event.rs) are modules of their own, their
//! items re-exported here.

mod event;
mod listing;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use event::{ClosingReason, Event, EventKind, EventReason, MAX_QUOTED_BYTES, quote_line};
pub use listing::{
    LeaseSummary, Listing, MAX_CMDLINE_BYTES, MAX_LISTED, MAX_LISTED_PER_TREE, MemberInfo,
    TreeInfo, TreeState,
};

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
mod tests;
