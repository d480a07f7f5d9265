//! The ring buffer's records, collected: a member's fork, exec and exit go on to subscribers,
//! a child the member map had no room for is killed, and roots' exits are handed back to be
//! acted on.

use std::rc::Rc;

use leash_client::protocol::{Event, EventKind, RootExitPolicy, TreeId};
use leash_common::{Diagnostic, EventKind as KernelEventKind};

use super::{owner::Owner, shared::Daemon};
use crate::{
    kernel::TreeEvent,
    proc::{ProcessRef, ns_to_ticks},
};

/// How often, and how many times, an untracked child that could not be opened is tried again.
const UNTRACKED_RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
const UNTRACKED_RETRIES: usize = 500;

/// Reads every record waiting in the ring buffer: forwards members' records, kills children
/// that could not be tracked, and tells subscribers of records the kernel had no room for.
/// Returns the trees whose root exited.
pub(super) fn collect(owner: &Rc<Owner>) -> Vec<TreeId> {
    let (events, lost) = {
        let mut tracker = owner.tracker();
        let events = tracker.drain_events();
        let dropped = tracker.stats().map_or(0, |stats| stats.events_dropped);
        (
            events,
            dropped.saturating_sub(owner.events_dropped.replace(dropped)),
        )
    };
    let mut root_exits = Vec::new();
    for event in events {
        match event.kind {
            KernelEventKind::RootExit => root_exits.push(event.tree),
            KernelEventKind::ForkFailed => kill_untracked_child(&event),
            KernelEventKind::Diagnostic => log_diagnostic(&event),
            _ => {}
        }
        forward(&owner.daemon, event);
    }
    if lost > 0 {
        owner.daemon.subscribers.dropped_everywhere(lost);
    }
    root_exits
}

/// Records `tree`'s root exit, once, and tells its subscribers; returns the tree's policy for
/// it, or None if the exit was recorded before (or the tree is gone).
pub(super) fn announce_root_exit(daemon: &Daemon, tree: TreeId) -> Option<RootExitPolicy> {
    let exit = daemon.registry.root_exited(tree)?;
    tracing::info!(tree, root = exit.root[0], policy = ?exit.policy, "root exited");
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
            let sent = pidfd.send_signal(libc::SIGKILL);
            tracing::warn!(
                tree,
                pid = child.pid,
                ?sent,
                "killed a child the member map had no room for"
            );
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
        KernelEventKind::ForkKilled | KernelEventKind::ForkFailed | KernelEventKind::Diagnostic => {
            return;
        }
    };
    let Some((audience, lease)) = daemon.registry.audience(kernel.tree) else {
        return;
    };
    if !daemon.subscribers.any_for(audience.owner, lease) {
        return;
    }
    let mut forwarded = Event::new(kind, kernel.tree, lease, Some(kernel.pid));
    forwarded.parent = (kind == EventKind::Fork).then_some(kernel.parent);
    forwarded.comm = Some(kernel.comm);
    daemon.emit(&audience, forwarded);
}
