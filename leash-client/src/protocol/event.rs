//! The `event` lines the daemon sends: what happened to a tree, and the connection's own news
//! (`closing`, `refused`).

mod reason;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use reason::EventReason;

use super::{ErrorCode, KillReason, KillSummary, LeaseId, TreeId};

/// Something that happened to a tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
// Read through `WireEvent`: its `reason` is typed by its `kind`.
#[serde(from = "WireEvent")]
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
    /// For `kill_started`: why ([`EventReason::Kill`]). For `kill_failed`: what failed, in
    /// words ([`EventReason::Failure`]). For `closing`: why the daemon closes the connection
    /// ([`EventReason::Closing`]). A plain string on the wire, read by the event's kind; a word
    /// this leash does not know for the kind is [`EventReason::Unknown`]. Set it with the
    /// variant its kind reads back (as the constructors below do), or the event read is not the
    /// one sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<EventReason>,
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
        event.reason = Some(EventReason::Closing(reason));
        event
    }

    /// A kill of `tree` of `lease` started, for `reason`.
    pub fn kill_started(tree: TreeId, lease: LeaseId, reason: KillReason) -> Self {
        let mut event = Self::new(EventKind::KillStarted, tree, lease, None);
        event.reason = Some(EventReason::Kill(reason));
        event
    }

    /// A kill of `tree` of `lease` gave up; `failure` says what failed.
    pub fn kill_failed(tree: TreeId, lease: LeaseId, failure: String) -> Self {
        let mut event = Self::new(EventKind::KillFailed, tree, lease, None);
        event.reason = Some(EventReason::Failure(failure));
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
        match self.reason {
            Some(EventReason::Closing(reason)) if self.kind == EventKind::Closing => Some(reason),
            _ => None,
        }
    }
}

/// An event as the wire has it, `reason` a plain string: which [`EventReason`] it is depends
/// on `kind`, which a field's own deserializer cannot see. The conversion names every field of
/// [`Event`], so the two cannot drift apart unseen.
#[derive(Deserialize)]
struct WireEvent {
    kind: EventKind,
    tree: TreeId,
    lease: LeaseId,
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    parent: Option<u32>,
    #[serde(default)]
    comm: Option<String>,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    kill: Option<KillSummary>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    code: Option<ErrorCode>,
    #[serde(default)]
    line: Option<String>,
}

impl From<WireEvent> for Event {
    fn from(wire: WireEvent) -> Self {
        Self {
            kind: wire.kind,
            tree: wire.tree,
            lease: wire.lease,
            pid: wire.pid,
            parent: wire.parent,
            comm: wire.comm,
            count: wire.count,
            kill: wire.kill,
            reason: wire
                .reason
                .map(|word| EventReason::from_word(wire.kind, word)),
            code: wire.code,
            line: wire.line,
        }
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
