//! Enforcement: when a root exits, a lease ends, a tree cannot be tracked or a client asks, the
//! tree is killed, once, by a kill task that every interested party waits on.
//!
//! Root exits are seen two ways: the ring buffer's events wake the daemon at once, and a sweep
//! of the kernel's per-tree state catches anything the events missed (they are best effort;
//! the maps are the truth).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use leash_client::protocol::{Event, EventKind, KillSummary, RootExitPolicy, TreeId};
use leash_common::EventKind as KernelEventKind;
use tokio::sync::watch;
use tracing::Instrument;

use super::{Daemon, KillOutcome, PendingKill};
use crate::{
    kernel::{Kill, KillError, KillStep, TreeEvent, TreeStatus},
    sys,
};

/// How often the per-tree state in the kernel is checked, whatever the events said.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// How often the ring buffer is read when nothing wakes the daemon: the programs wake it only
/// for a root's exit, and leave fork, exec and exit records to be collected.
const COLLECT_EVERY: Duration = Duration::from_millis(50);

/// Reacts to the ring buffer's root-exit events as soon as they are written, and collects the
/// other records every 50 ms.
pub async fn watch_events(daemon: Arc<Daemon>) {
    let readable = daemon.tracker().events_fd().and_then(sys::async_readable);
    let readable = match readable {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("cannot watch the event ring buffer ({e}); relying on the sweep");
            return;
        }
    };
    let mut collect = tokio::time::interval(COLLECT_EVERY);
    loop {
        tokio::select! {
            ready = readable.readable() => match ready {
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => return,
            },
            _ = collect.tick() => {}
        }
        collect_events(&daemon);
    }
}

/// Reads every record waiting in the ring buffer: acts on root exits, forwards the rest.
fn collect_events(daemon: &Arc<Daemon>) {
    let events = daemon.tracker().drain_events();
    for event in events {
        match event.kind {
            KernelEventKind::RootExit => root_exited(daemon, event.tree),
            KernelEventKind::ForkFailed => kill_untracked_child(&event),
            _ => {}
        }
        forward(daemon, event);
    }
}

/// A member's child could not join its tree (the member map is full): its forker died in the
/// kernel, and the child, which nothing tracks, is killed now, before it can do much. (Its
/// tree is killed as untrackable by the sweep.)
fn kill_untracked_child(event: &TreeEvent) {
    let child = crate::proc::ProcessRef {
        pid: event.pid,
        start_ticks: crate::proc::ns_to_ticks(event.time_ns),
    };
    match child.open() {
        Ok(Some(pidfd)) => {
            let sent = pidfd.send_signal(libc::SIGKILL);
            tracing::warn!(
                tree = event.tree,
                pid = event.pid,
                ?sent,
                "killed a child the member map had no room for"
            );
        }
        Ok(None) => {}
        Err(e) => tracing::error!(pid = event.pid, "cannot kill an untracked child: {e}"),
    }
}

/// Passes a member's fork, exec or exit on to subscribers (who may drop them if they read
/// slowly: the daemon never waits for a viewer).
fn forward(daemon: &Daemon, kernel: TreeEvent) {
    if daemon.events.receiver_count() == 0 {
        return;
    }
    let kind = match kernel.kind {
        KernelEventKind::Fork => EventKind::Fork,
        KernelEventKind::Exec => EventKind::Exec,
        KernelEventKind::Exit | KernelEventKind::RootExit => EventKind::Exit,
        KernelEventKind::ForkKilled | KernelEventKind::ForkFailed => return,
    };
    let Some((owner, lease)) = daemon
        .state()
        .trees
        .get(&kernel.tree)
        .map(|entry| (entry.owner_uid, entry.lease))
    else {
        return;
    };
    let mut forwarded = event(kind, kernel.tree, lease, Some(kernel.pid));
    forwarded.parent = (kind == EventKind::Fork).then_some(kernel.parent);
    forwarded.comm = Some(kernel.comm);
    daemon.emit(owner, forwarded);
}

/// The backstop: reads every live tree's state in the kernel.
pub async fn sweep(daemon: Arc<Daemon>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let live: Vec<TreeId> = daemon
            .state()
            .trees
            .iter()
            .filter(|(_, entry)| entry.kill.is_none())
            .map(|(&tree, _)| tree)
            .collect();
        for tree in live {
            let Ok(status) = daemon.tracker().tree_status(tree) else {
                continue;
            };
            if let Some(reason) = fail_closed(&status) {
                tracing::error!(
                    tree,
                    reason,
                    over_quota = status.over_quota,
                    failed = status.failed_inserts,
                    "tree cannot be tracked"
                );
                start_kill(&daemon, tree, None, reason);
                continue;
            }
            if status.root_exit_ns.is_some() {
                root_exited(&daemon, tree);
                finish_if_kept_and_empty(&daemon, tree);
            }
        }
    }
}

/// Records a root's exit once and applies the tree's policy.
fn root_exited(daemon: &Arc<Daemon>, tree: TreeId) {
    let (owner, lease, root, policy) = {
        let mut state = daemon.state();
        let Some(entry) = state.trees.get_mut(&tree) else {
            return;
        };
        if entry.root_exited {
            return;
        }
        entry.root_exited = true;
        (entry.owner_uid, entry.lease, entry.root, entry.on_root_exit)
    };
    tracing::info!(tree, root, ?policy, "root exited");
    daemon.emit(owner, event(EventKind::RootExited, tree, lease, Some(root)));
    // A root killed as it forked past what may be tracked: say why the tree dies.
    let untrackable = daemon
        .tracker()
        .tree_status(tree)
        .ok()
        .and_then(|status| fail_closed(&status));
    if let Some(reason) = untrackable {
        start_kill(daemon, tree, None, reason);
    } else if policy == RootExitPolicy::Kill {
        start_kill(daemon, tree, None, "root_exited");
    }
}

/// Why a tree must be killed however its policy reads (fail closed), if it must: it forked
/// past its owner's member quota (`member_quota`), or a child could not be tracked because the
/// member map was full (`untrackable`).
fn fail_closed(status: &TreeStatus) -> Option<&'static str> {
    if status.over_quota > 0 {
        Some("member_quota")
    } else if status.failed_inserts > 0 {
        Some("untrackable")
    } else {
        None
    }
}

/// A tree whose members were kept after its root exited ends when it has emptied on its own.
fn finish_if_kept_and_empty(daemon: &Arc<Daemon>, tree: TreeId) {
    let empty = daemon.tracker().is_empty(tree).unwrap_or(false);
    let kept =
        daemon.state().trees.get(&tree).is_some_and(|entry| {
            entry.on_root_exit == RootExitPolicy::Keep && entry.kill.is_none()
        });
    if kept && empty {
        tracing::info!(tree, "tree is empty");
        end_tree(daemon, tree, None);
    }
}

/// An empty tree's end: its members' last records go out (they are queued already, and are
/// forwarded while the tree is still known), then it leaves the maps and `tree_empty` is sent.
fn end_tree(daemon: &Arc<Daemon>, tree: TreeId, kill: Option<KillSummary>) {
    collect_events(daemon);
    let Some(entry) = daemon.state().trees.remove(&tree) else {
        return;
    };
    if let Err(e) = daemon.tracker().release(tree) {
        tracing::warn!(tree, "releasing an empty tree: {e:#}");
    }
    let mut empty = event(EventKind::TreeEmpty, tree, entry.lease, None);
    empty.kill = kill;
    daemon.emit(entry.owner_uid, empty);
}

/// Starts killing `tree`, and every tree nested in it, unless a kill is already under way;
/// either way returns what to wait on for the outcome. None if there is no such tree.
///
/// The grace period is the tree's own, or `grace` if that is shorter: it is at most what the
/// tree was registered with. A kill already under way keeps going, with its grace shortened to
/// `grace` (or the tree's own) if that is shorter.
pub fn start_kill(
    daemon: &Arc<Daemon>,
    tree: TreeId,
    grace: Option<Duration>,
    reason: &'static str,
) -> Option<watch::Receiver<Option<KillOutcome>>> {
    let (owner, lease, grace, done, pending, grace_asked) = {
        let mut state = daemon.state();
        let entry = state.trees.get_mut(&tree)?;
        let grace = grace.map_or(entry.grace, |asked| asked.min(entry.grace));
        if let Some(pending) = &entry.kill {
            pending.grace.send_if_modified(|now| {
                let shorter = grace < *now;
                *now = (*now).min(grace);
                shorter
            });
            return Some(pending.outcome.clone());
        }
        let (done, outcome) = watch::channel(None);
        let (grace_asked, grace_seen) = watch::channel(grace);
        entry.kill = Some(PendingKill {
            outcome: outcome.clone(),
            grace: grace_asked,
        });
        entry.unkillable = false;
        (
            entry.owner_uid,
            entry.lease,
            grace,
            done,
            outcome,
            grace_seen,
        )
    };
    // Doomed before anyone hears of the kill: from then on no member forks, and a daemon that
    // takes over after this one dies finishes the kill (the kill task dooms it again, harmlessly).
    let nested = {
        let mut tracker = daemon.tracker();
        if let Err(e) = tracker.doom(tree) {
            tracing::warn!(tree, "dooming the tree: {e:#}");
        }
        tracker.nested(tree)
    };
    // What is nested dies with it, given no more time than it.
    let nested: Vec<_> = nested
        .into_iter()
        .filter_map(|inner| start_kill(daemon, inner, Some(grace), "enclosing_killed"))
        .collect();
    let mut started = event(EventKind::KillStarted, tree, lease, None);
    started.reason = Some(reason.to_owned());
    daemon.emit(owner, started);
    let span = tracing::info_span!("kill", tree, reason, grace_ms = grace.as_millis());
    let daemon = daemon.clone();
    tokio::spawn(
        async move {
            // Done when the nested trees are done too; a failure of theirs is the kill's.
            let mut result = drive_kill(&daemon, tree, grace_asked, reason).await;
            for inner in nested {
                if let (Ok(_), Err(e)) = (&result, outcome(inner).await) {
                    result = Err(e);
                }
            }
            match &result {
                Ok(summary) => {
                    tracing::info!(?summary, "tree is empty");
                    end_tree(&daemon, tree, Some(summary.clone()));
                }
                Err(e) => {
                    tracing::error!("kill failed: {e}");
                    kill_failed(&daemon, tree, e);
                }
            }
            let _ = done.send(Some(result));
        }
        .instrument(span),
    );
    Some(pending)
}

/// A kill gave up: the tree stays, doomed, and says so; another kill may try again.
fn kill_failed(daemon: &Daemon, tree: TreeId, error: &KillError) {
    let Some((owner, lease)) = daemon.state().trees.get_mut(&tree).map(|entry| {
        entry.kill = None;
        entry.unkillable = true;
        (entry.owner_uid, entry.lease)
    }) else {
        return;
    };
    let mut failed = event(EventKind::KillFailed, tree, lease, None);
    failed.reason = Some(error.to_string());
    daemon.emit(owner, failed);
}

/// Steps the kill engine, holding the tracker only for each step.
async fn drive_kill(
    daemon: &Daemon,
    tree: TreeId,
    grace: watch::Receiver<Duration>,
    reason: &str,
) -> KillOutcome {
    let mut kill = Kill::new(tree, *grace.borrow());
    loop {
        kill.shorten_grace(*grace.borrow());
        let step = kill.step(&mut daemon.tracker())?;
        match step {
            KillStep::Wait(pause) => tokio::time::sleep(pause).await,
            KillStep::Done(report) => {
                return Ok(KillSummary {
                    tree,
                    terminated: report.terminated as u64,
                    killed: report.killed as u64,
                    rounds: report.rounds,
                    elapsed_ms: u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
                    reason: reason.to_owned(),
                });
            }
        }
    }
}

/// Waits for a kill started by [`start_kill`].
pub async fn outcome(mut pending: watch::Receiver<Option<KillOutcome>>) -> KillOutcome {
    match pending.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.clone().expect("waited for Some"),
        Err(_) => Err(KillError::Kernel {
            tree: 0,
            message: "the kill task ended without an outcome".to_owned(),
        }),
    }
}

/// A lease ended (its host died or its connection closed): every tree it holds is killed.
pub fn end_lease(daemon: &Arc<Daemon>, lease: u64) {
    let trees: Vec<TreeId> = {
        let mut state = daemon.state();
        state.leases.remove(&lease);
        state
            .trees
            .iter()
            .filter(|(_, entry)| entry.lease == lease)
            .map(|(&tree, _)| tree)
            .collect()
    };
    for tree in trees {
        start_kill(daemon, tree, None, "lease_ended");
    }
}

/// Kills every tree and waits until all are empty (shutdown).
pub async fn kill_all(daemon: &Arc<Daemon>, reason: &'static str) {
    let trees: Vec<TreeId> = daemon.state().trees.keys().copied().collect();
    let started = Instant::now();
    let pending: Vec<_> = trees
        .iter()
        .filter_map(|&tree| start_kill(daemon, tree, None, reason))
        .collect();
    for kill in pending {
        let _ = outcome(kill).await;
    }
    tracing::info!(trees = trees.len(), elapsed = ?started.elapsed(), "every tree killed");
}

pub(super) fn event(kind: EventKind, tree: TreeId, lease: u64, pid: Option<u32>) -> Event {
    Event {
        kind,
        tree,
        lease,
        pid,
        parent: None,
        comm: None,
        count: None,
        kill: None,
        reason: None,
    }
}

pub(super) fn registered_event(tree: TreeId, lease: u64, root: u32) -> Event {
    event(EventKind::Registered, tree, lease, Some(root))
}

pub(super) fn released_event(tree: TreeId, lease: u64) -> Event {
    event(EventKind::Released, tree, lease, None)
}
