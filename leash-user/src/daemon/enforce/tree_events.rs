//! The ring buffer's records, collected: a member's fork, exec and exit go on to subscribers,
//! a child the member map had no room for is killed, and roots' exits are handed back to be
//! acted on.

use std::rc::Rc;

use leash_client::protocol::{Event, EventKind, LeaseId, RootExitPolicy, TreeId};
use leash_common::{Diagnostic, EventKind as KernelEventKind};

use crate::{
    daemon::state::{owner::Owner, shared::Daemon},
    kernel::TreeEvent,
    proc::{ProcessRef, ns_to_ticks},
};

/// How often, and how many times, an untracked child that could not be opened is tried again.
const UNTRACKED_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
const UNTRACKED_RETRIES: usize = 500;

/// What the daemon must act on among the records collected.
#[derive(Debug, Default)]
pub(in crate::daemon) struct Collected {
    /// Trees whose root exited.
    pub root_exits: Vec<TreeId>,
    /// Hosts the kernel saw start to die.
    pub hosts_dying: Vec<HostDying>,
}

/// A host the kernel saw start to die.
#[derive(Debug)]
pub(in crate::daemon) struct HostDying {
    pub host: ProcessRef,
    /// The signal it dies of.
    pub signal: u32,
    /// The name of the task that sent it (the host's own, for a crash).
    pub sender: String,
}

impl HostDying {
    /// A `HostDying` record: the host's pid, its start time in `time_ns`, the signal in
    /// `parent`.
    fn of(record: &TreeEvent) -> Self {
        Self {
            host: ProcessRef {
                pid: record.pid,
                start_ticks: ns_to_ticks(record.time_ns),
            },
            signal: record.parent,
            sender: record.comm.clone(),
        }
    }
}

/// The live leases of a host the kernel saw start to die (theirs to end), its death told in
/// the log if it held any.
pub(in crate::daemon) fn leases_of_dying_host(daemon: &Daemon, dying: &HostDying) -> Vec<LeaseId> {
    let leases = daemon.registry.leases_of(dying.host);
    if !leases.is_empty() {
        tracing::info!(
            parent: None,
            event = "host_dying",
            host_pid = dying.host.pid,
            signal = dying.signal,
            sender = dying.sender,
            "host is dying"
        );
    }
    leases
}

/// Reads every record waiting in the ring buffer: forwards members' records, kills children
/// that could not be tracked, and tells subscribers of records the kernel had no room for.
/// Returns what the caller must act on: roots that exited, hosts that are dying.
pub(in crate::daemon) fn collect(owner: &Rc<Owner>) -> Collected {
    let (events, lost) = {
        let mut tracker = owner.tracker();
        let events = tracker.drain_events();
        let dropped = tracker.stats().map_or(0, |stats| stats.events_dropped);
        (
            events,
            dropped.saturating_sub(owner.events_dropped.replace(dropped)),
        )
    };
    let mut collected = Collected::default();
    for event in events {
        match event.kind {
            KernelEventKind::RootExit => collected.root_exits.push(event.tree),
            KernelEventKind::HostDying => collected.hosts_dying.push(HostDying::of(&event)),
            KernelEventKind::ForkFailed => kill_untracked_child(&event),
            KernelEventKind::Diagnostic => log_diagnostic(&event),
            _ => {}
        }
        forward(&owner.daemon, event);
    }
    if lost > 0 {
        owner.daemon.subscribers.dropped_everywhere(lost);
    }
    collected
}

/// Records `tree`'s root exit, once, and tells its subscribers; returns the tree's policy for
/// it, or None if the exit was recorded before (or the tree is gone).
pub(in crate::daemon) fn announce_root_exit(
    daemon: &Daemon,
    tree: TreeId,
) -> Option<RootExitPolicy> {
    let exit = daemon.registry.root_exited(tree)?;
    tracing::info!(
        tree,
        root = exit.root[0],
        policy = exit.policy.as_str(),
        "root exited"
    );
    daemon.emit_about_root(
        &exit.audience,
        Event::new(EventKind::RootExited, tree, exit.lease, Some(exit.root[0])),
        &exit.root,
    );
    Some(exit.policy)
}

/// A program's report of a rare path (see [`Diagnostic`]), in the daemon's log: WARN, with its
/// fields (`kernel_diagnostic`).
fn log_diagnostic(event: &TreeEvent) {
    let (tree, pid) = (event.tree, event.pid);
    let (what, message) = match Diagnostic::from_u32(event.parent) {
        Some(Diagnostic::ChildUnread) => (
            "child_unread",
            "a member forked and its child could not be read: the child is not tracked",
        ),
        Some(Diagnostic::StartUnread) => (
            "start_unread",
            "a member's child's start time could not be read: it is tracked with none",
        ),
        Some(Diagnostic::QuotaHit) => (
            "quota_hit",
            "a member forked past its owner's member quota: the forker was killed",
        ),
        None => ("unknown", "a diagnostic this daemon does not know"),
    };
    tracing::warn!(
        parent: None,
        event = "kernel_diagnostic",
        what,
        tree,
        pid,
        comm = event.comm.as_str(),
        "{message}"
    );
}

/// A member's child could not join its tree (the member map is full): its forker died in the
/// kernel, and the child, which nothing tracks, is killed now, before it can do much. (Its
/// tree is killed as untrackable by the sweep.) If it cannot be opened now (out of descriptors,
/// say), it is tried again shortly: that is never taken for its being gone.
fn kill_untracked_child(event: &TreeEvent) {
    let child = ProcessRef {
        pid: event.pid,
        start_ticks: ns_to_ticks(event.time_ns),
    };
    let tree = event.tree;
    let attempt = move || match child.open() {
        Ok(Some(pidfd)) => {
            match pidfd.send_signal(libc::SIGKILL) {
                Ok(()) => tracing::warn!(
                    tree,
                    pid = child.pid,
                    "killed a child the member map had no room for"
                ),
                Err(e) => tracing::warn!(
                    tree,
                    pid = child.pid,
                    "cannot kill a child the member map had no room for: {e}"
                ),
            }
            true
        }
        Ok(None) => true,
        Err(e) => {
            tracing::error!(pid = child.pid, "cannot kill an untracked child yet: {e}");
            false
        }
    };
    if attempt() {
        return;
    }
    tokio::task::spawn_local(async move {
        for _ in 0..UNTRACKED_RETRIES {
            tokio::time::sleep(UNTRACKED_RETRY_EVERY).await;
            if attempt() {
                return;
            }
        }
    });
}

/// Passes a member's fork, exec or exit on to subscribers (who may drop them if they read
/// slowly: the daemon never waits for a viewer).
fn forward(daemon: &Daemon, kernel: TreeEvent) {
    let kind = match kernel.kind {
        KernelEventKind::Fork => EventKind::Fork,
        KernelEventKind::Exec => EventKind::Exec,
        KernelEventKind::Exit | KernelEventKind::RootExit => EventKind::Exit,
        KernelEventKind::ForkKilled
        | KernelEventKind::ForkFailed
        | KernelEventKind::Diagnostic
        | KernelEventKind::HostDying => return,
    };
    let Some((audience, lease)) = daemon.registry.audience(kernel.tree) else {
        return;
    };
    if !daemon.subscribers.any_for(audience.owner_uid, lease) {
        return;
    }
    let mut forwarded = Event::new(kind, kernel.tree, lease, Some(kernel.pid));
    forwarded.parent = (kind == EventKind::Fork).then_some(kernel.parent);
    forwarded.comm = Some(kernel.comm);
    daemon.emit(&audience, forwarded);
}
