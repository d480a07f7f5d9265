//! Enforcement: when a root exits, a lease ends, a tree cannot be tracked or a client asks, the
//! tree is killed, once, by a kill task that every interested party waits on.
//!
//! Root exits are seen two ways: the ring buffer's events wake the daemon at once, and a sweep
//! of the kernel's per-tree state catches anything the events missed (they are best effort;
//! the maps are the truth).

use std::{
    os::fd::OwnedFd,
    rc::Rc,
    time::{Duration, Instant},
};

use leash_client::protocol::{Event, EventKind, KillSummary, LeaseId, RootExitPolicy, TreeId};
use leash_common::EventKind as KernelEventKind;
use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use super::{Daemon, KillOutcome, PendingKill, owner::Owner};
use crate::{
    kernel::{Kill, KillError, KillStep, TreeEvent, TreeStatus},
    sys,
};

/// How often the per-tree state in the kernel is checked, whatever the events said.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// How often the ring buffer is read when nothing wakes the daemon: the programs wake it only
/// for a root's exit, and leave fork, exec and exit records to be collected.
const COLLECT_EVERY: Duration = Duration::from_millis(50);
/// How often, and how many times, an untracked child that could not be opened is tried again.
const UNTRACKED_RETRY_EVERY: Duration = Duration::from_millis(20);
const UNTRACKED_RETRIES: usize = 500;

/// Reacts to the ring buffer's root-exit events as soon as they are written, and collects the
/// other records every 50 ms.
pub async fn watch_events(owner: Rc<Owner>) {
    let readable = owner.tracker().events_fd().and_then(sys::async_readable);
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
        collect_events(&owner);
    }
}

/// Reads every record waiting in the ring buffer: acts on root exits, forwards the rest, and
/// tells subscribers of records the kernel had no room for.
fn collect_events(owner: &Rc<Owner>) {
    let (events, lost) = {
        let mut tracker = owner.tracker();
        let events = tracker.drain_events();
        let dropped = tracker.stats().map_or(0, |stats| stats.events_dropped);
        (
            events,
            dropped.saturating_sub(owner.events_dropped.replace(dropped)),
        )
    };
    for event in events {
        match event.kind {
            KernelEventKind::RootExit => root_exited(owner, event.tree),
            KernelEventKind::ForkFailed => kill_untracked_child(&event),
            _ => {}
        }
        forward(&owner.daemon, event);
    }
    if lost > 0 {
        owner.daemon.subscribers.dropped_everywhere(lost);
    }
}

/// A member's child could not join its tree (the member map is full): its forker died in the
/// kernel, and the child, which nothing tracks, is killed now, before it can do much. (Its
/// tree is killed as untrackable by the sweep.) If it cannot be opened now (out of descriptors,
/// say), it is tried again shortly: that is never taken for its being gone.
fn kill_untracked_child(event: &TreeEvent) {
    let child = crate::proc::ProcessRef {
        pid: event.pid,
        start_ticks: crate::proc::ns_to_ticks(event.time_ns),
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
        KernelEventKind::ForkKilled | KernelEventKind::ForkFailed => return,
    };
    let Some((audience, lease)) = daemon
        .state()
        .trees
        .get(&kernel.tree)
        .map(|entry| (entry.audience(), entry.lease))
    else {
        return;
    };
    if !daemon.subscribers.any_for(audience.owner, lease) {
        return;
    }
    let mut forwarded = event(kind, kernel.tree, lease, Some(kernel.pid));
    forwarded.parent = (kind == EventKind::Fork).then_some(kernel.parent);
    forwarded.comm = Some(kernel.comm);
    daemon.emit(&audience, forwarded);
}

/// The backstop: reads every live tree's state in the kernel.
pub async fn sweep(owner: Rc<Owner>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    loop {
        every.tick().await;
        let live: Vec<TreeId> = owner
            .daemon
            .state()
            .trees
            .iter()
            .filter(|(_, entry)| entry.kill.is_none())
            .map(|(&tree, _)| tree)
            .collect();
        for tree in live {
            let Ok(status) = owner.tracker().tree_status(tree) else {
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
                start_kill(&owner, tree, None, reason);
                continue;
            }
            if status.root_exit_ns.is_some() {
                root_exited(&owner, tree);
                finish_if_kept_and_empty(&owner, tree);
            }
        }
    }
}

/// Records a root's exit once and applies the tree's policy.
fn root_exited(owner: &Rc<Owner>, tree: TreeId) {
    let daemon = &owner.daemon;
    let (audience, lease, root, policy) = {
        let mut state = daemon.state();
        let Some(entry) = state.trees.get_mut(&tree) else {
            return;
        };
        if entry.root_exited {
            return;
        }
        entry.root_exited = true;
        (
            entry.audience(),
            entry.lease,
            entry.root.clone(),
            entry.on_root_exit,
        )
    };
    tracing::info!(tree, root = root[0], ?policy, "root exited");
    daemon.emit_about_root(
        &audience,
        event(EventKind::RootExited, tree, lease, Some(root[0])),
        &root,
    );
    // A root killed as it forked past what may be tracked: say why the tree dies.
    let status = owner.tracker().tree_status(tree);
    let untrackable = status.ok().and_then(|status| fail_closed(&status));
    if let Some(reason) = untrackable {
        start_kill(owner, tree, None, reason);
    } else if policy == RootExitPolicy::Kill {
        start_kill(owner, tree, None, "root_exited");
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
fn finish_if_kept_and_empty(owner: &Rc<Owner>, tree: TreeId) {
    let empty = owner.tracker().is_empty(tree).unwrap_or(false);
    let kept =
        owner.daemon.state().trees.get(&tree).is_some_and(|entry| {
            entry.on_root_exit == RootExitPolicy::Keep && entry.kill.is_none()
        });
    if kept && empty {
        tracing::info!(tree, "tree is empty");
        end_tree(owner, tree, None);
    }
}

/// An empty tree's end: its members' last records go out (they are queued already, and are
/// forwarded while the tree is still known), then it leaves the maps and `tree_empty` is sent.
fn end_tree(owner: &Rc<Owner>, tree: TreeId, kill: Option<KillSummary>) {
    collect_events(owner);
    let Some(entry) = owner.daemon.state().trees.remove(&tree) else {
        return;
    };
    let released = owner.tracker().release(tree);
    if let Err(e) = released {
        tracing::warn!(tree, "releasing an empty tree: {e:#}");
    }
    let mut empty = event(EventKind::TreeEmpty, tree, entry.lease, None);
    empty.kill = kill;
    owner.daemon.emit(&entry.audience(), empty);
}

/// Starts killing `tree`, and every tree nested in it, unless a kill is already under way;
/// either way returns what to wait on for the outcome. None if there is no such tree.
///
/// The grace period is the tree's own, or `grace` if that is shorter: it is at most what the
/// tree was registered with. A kill already under way keeps going, with its grace shortened to
/// `grace` (or the tree's own) if that is shorter.
pub fn start_kill(
    owner: &Rc<Owner>,
    tree: TreeId,
    grace: Option<Duration>,
    reason: &'static str,
) -> Option<watch::Receiver<Option<KillOutcome>>> {
    let daemon = &owner.daemon;
    let (audience, lease, holder, grace, done, pending, grace_asked) = {
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
        daemon.metrics.kill_started(reason);
        (
            entry.audience(),
            entry.lease,
            (entry.host_pid, entry.owner_uid),
            grace,
            done,
            outcome,
            grace_seen,
        )
    };
    // Doomed before anyone hears of the kill: from then on no member forks, and a daemon that
    // takes over after this one dies finishes the kill (the kill task dooms it again, harmlessly).
    let nested = {
        let mut tracker = owner.tracker();
        if let Err(e) = tracker.doom(tree) {
            tracing::warn!(tree, "dooming the tree: {e:#}");
        }
        tracker.nested(tree)
    };
    // What is nested dies with it, given no more time than it.
    let nested: Vec<_> = nested
        .into_iter()
        .filter_map(|inner| start_kill(owner, inner, Some(grace), "enclosing_killed"))
        .collect();
    let mut started = event(EventKind::KillStarted, tree, lease, None);
    started.reason = Some(reason.to_owned());
    daemon.emit(&audience, started);
    let span = tracing::info_span!("kill", tree, reason, grace_ms = grace.as_millis());
    let owner = owner.clone();
    tokio::task::spawn_local(
        async move {
            // Done when the nested trees are done too; a failure of theirs is the kill's, and
            // their members count in its summary (an agent that moved its processes into
            // nested trees does not make its host's kill look empty).
            let mut result = drive_kill(&owner, tree, grace_asked, reason).await;
            for inner in nested {
                match (&mut result, outcome(inner).await) {
                    (Ok(summary), Ok(inner)) => {
                        summary.terminated += inner.terminated;
                        summary.killed += inner.killed;
                        summary.rounds = summary.rounds.max(inner.rounds);
                    }
                    (Ok(_), Err(e)) => result = Err(e),
                    (Err(_), _) => {}
                }
            }
            match &result {
                Ok(summary) => {
                    let (host_pid, uid) = holder;
                    tracing::info!(
                        parent: None,
                        event = "tree_killed",
                        tree,
                        lease,
                        host_pid,
                        uid,
                        reason,
                        terminated = summary.terminated,
                        killed = summary.killed,
                        rounds = summary.rounds,
                        elapsed_ms = summary.elapsed_ms,
                        "tree killed"
                    );
                    end_tree(&owner, tree, Some(summary.clone()));
                }
                Err(e) => {
                    tracing::error!(tree, lease, "kill failed: {e}");
                    kill_failed(&owner.daemon, tree, e);
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
    daemon.metrics.kill_failed();
    let Some((audience, lease)) = daemon.state().trees.get_mut(&tree).map(|entry| {
        entry.kill = None;
        entry.unkillable = true;
        (entry.audience(), entry.lease)
    }) else {
        return;
    };
    let mut failed = event(EventKind::KillFailed, tree, lease, None);
    failed.reason = Some(error.to_string());
    daemon.emit(&audience, failed);
}

/// Steps the kill engine, holding the tracker only for each step; between steps, the owner's
/// other work takes its turn.
async fn drive_kill(
    owner: &Owner,
    tree: TreeId,
    grace: watch::Receiver<Duration>,
    reason: &str,
) -> KillOutcome {
    let mut kill = Kill::new(tree, *grace.borrow());
    loop {
        kill.shorten_grace(*grace.borrow());
        let step = kill.step(&mut owner.tracker());
        match step? {
            KillStep::Wait(Duration::ZERO) => tokio::task::yield_now().await,
            KillStep::Wait(pause) => tokio::time::sleep(pause).await,
            KillStep::Done(report) => {
                owner.daemon.metrics.kill_done(report.elapsed);
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

/// A lease ended (its host died or its connection closed), for `reason` (`host_exited`,
/// `connection_closed`, ...): every tree it holds is killed.
pub fn end_lease(owner: &Rc<Owner>, lease: u64, reason: &str) {
    owner.daemon.remove_lease(lease, reason);
    let trees: Vec<TreeId> = {
        let state = owner.daemon.state();
        state
            .trees
            .iter()
            .filter(|(_, entry)| entry.lease == lease)
            .map(|(&tree, _)| tree)
            .collect()
    };
    for tree in trees {
        start_kill(owner, tree, None, "lease_ended");
    }
}

/// Ends `lease` when its host process (`pidfd`) exits; stops watching, without ending it, when
/// `until` closes (the connection that holds the lease ended, and ends it itself).
pub fn watch_host(
    owner: &Rc<Owner>,
    lease: LeaseId,
    pidfd: OwnedFd,
    until: Option<oneshot::Receiver<()>>,
) {
    let host = match sys::async_readable(pidfd) {
        Ok(host) => host,
        Err(e) => {
            tracing::error!(lease, "cannot watch the host: {e}; ending its lease");
            return end_lease(owner, lease, "host_unwatchable");
        }
    };
    let owner = owner.clone();
    tokio::task::spawn_local(async move {
        let served = async {
            match until {
                Some(until) => {
                    let _ = until.await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = host.readable() => end_lease(&owner, lease, "host_exited"),
            () = served => {}
        }
    });
}

/// Kills every tree and waits until all are empty (shutdown).
pub async fn kill_all(owner: &Rc<Owner>, reason: &'static str) {
    let trees: Vec<TreeId> = owner.daemon.state().trees.keys().copied().collect();
    let started = Instant::now();
    let pending: Vec<_> = trees
        .iter()
        .filter_map(|&tree| start_kill(owner, tree, None, reason))
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
