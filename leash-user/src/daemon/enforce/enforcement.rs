//! Enforcement: a tree is killed, once, by a kill task that every interested party waits on,
//! with every tree nested in it; then it ends, and its subscribers hear how the kill went.

use std::{
    rc::Rc,
    time::{Duration, Instant},
};

use leash_client::protocol::{Event, EventKind, KillReason, KillSummary, TreeId};
use tokio::sync::watch;
use tracing::Instrument;

use super::tree_events;
use crate::{
    daemon::{
        rules::lease_end::LeaseEnd,
        state::{
            owner::Owner,
            registry::{BegunKill, KillOutcome, KillStart, PendingOutcome},
            shared::Daemon,
        },
    },
    kernel::{Kill, KillError, KillStep},
};

/// Starts killing `tree`, and every tree nested in it, unless a kill is already under way;
/// either way returns what to wait on for the outcome. None if there is no such tree.
///
/// The grace period is the tree's own, or `grace` if that is shorter: it is at most what the
/// tree was registered with. A kill already under way keeps going, with its grace shortened to
/// `grace` (or the tree's own) if that is shorter.
pub(in crate::daemon) fn start_kill(
    owner: &Rc<Owner>,
    tree: TreeId,
    grace: Option<Duration>,
    reason: KillReason,
) -> Option<PendingOutcome> {
    let daemon = &owner.daemon;
    let begun = match daemon.registry.begin_kill(tree, grace)? {
        KillStart::UnderWay(outcome) => return Some(outcome),
        KillStart::Begun(begun) => begun,
    };
    daemon.metrics.kill_started(reason);
    // Doomed before anyone hears of the kill: from then on no member forks, and a daemon that
    // takes over after this one dies finishes the kill (the kill task dooms it again, harmlessly).
    let nested = {
        let mut tracker = owner.tracker();
        if let Err(e) = tracker.doom(tree) {
            tracing::warn!(tree, "dooming the tree: {}", e.with_causes());
        }
        tracker.nested(tree)
    };
    // What is nested dies with it, given no more time than it.
    let nested: Vec<_> = nested
        .into_iter()
        .filter_map(|inner| {
            start_kill(owner, inner, Some(begun.grace), KillReason::EnclosingKilled)
        })
        .collect();
    daemon.emit(
        &begun.audience,
        Event::kill_started(tree, begun.lease, reason),
    );
    let outcome = begun.outcome.clone();
    let span = tracing::info_span!(
        "kill",
        tree,
        reason = reason.as_str(),
        grace_ms = begun.grace.as_millis()
    );
    tokio::task::spawn_local(run_kill(owner.clone(), tree, reason, begun, nested).instrument(span));
    Some(outcome)
}

/// The kill task: drives the kill, then ends the tree, or marks it unkillable.
async fn run_kill(
    owner: Rc<Owner>,
    tree: TreeId,
    reason: KillReason,
    begun: BegunKill,
    nested: Vec<PendingOutcome>,
) {
    let BegunKill {
        lease,
        host_pid,
        owner_uid: uid,
        done,
        grace_asked,
        ..
    } = begun;
    // Done when the nested trees are done too; a failure of theirs is the kill's, and their
    // members count in its summary (an agent that moved its processes into nested trees does
    // not make its host's kill look empty).
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
            tracing::info!(
                parent: None,
                event = "tree_killed",
                tree,
                lease,
                host_pid,
                uid,
                reason = reason.as_str(),
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

/// A kill gave up: the tree stays, doomed, and says so; another kill may try again.
fn kill_failed(daemon: &Daemon, tree: TreeId, error: &KillError) {
    daemon.metrics.kill_failed();
    let Some((audience, lease)) = daemon.registry.kill_failed(tree) else {
        return;
    };
    daemon.emit(
        &audience,
        Event::kill_failed(tree, lease, error.to_string()),
    );
}

/// Steps the kill engine, holding the tracker only for each step; between steps, the owner's
/// other work takes its turn.
async fn drive_kill(
    owner: &Owner,
    tree: TreeId,
    grace: watch::Receiver<Duration>,
    reason: KillReason,
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
                    reason,
                });
            }
        }
    }
}

/// An empty tree's end: its members' last records go out (they are queued already, and are
/// forwarded while the tree is still known), then it leaves the maps and `tree_empty` is sent.
/// Roots' exits among the records are told at once; other trees' policies for them, and the
/// ends of dying hosts' leases, are applied in the owner's next turn.
pub(in crate::daemon) fn end_tree(owner: &Rc<Owner>, tree: TreeId, kill: Option<KillSummary>) {
    let collected = tree_events::collect(owner);
    for exited in collected.root_exits {
        let policy = tree_events::announce_root_exit(&owner.daemon, exited);
        if let Some(policy) = policy.filter(|_| exited != tree) {
            owner.daemon.jobs.apply_root_exit(exited, policy);
        }
    }
    for dying in &collected.hosts_dying {
        for lease in tree_events::leases_of_dying_host(&owner.daemon, dying) {
            owner.daemon.jobs.end_lease(lease, LeaseEnd::HostKilled);
        }
    }
    let Some(entry) = owner.daemon.registry.remove(tree) else {
        return;
    };
    let released = owner.tracker().release(tree);
    if let Err(e) = released {
        tracing::warn!(tree, "releasing an empty tree: {}", e.with_causes());
    }
    let mut empty = Event::new(EventKind::TreeEmpty, tree, entry.lease, None);
    empty.kill = kill;
    owner.daemon.emit(&entry.audience(), empty);
}

/// Waits for a kill started by [`start_kill`].
pub(in crate::daemon) async fn outcome(mut pending: PendingOutcome) -> KillOutcome {
    match pending.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.clone().expect("waited for Some"),
        Err(_) => Err(KillError::Kernel {
            tree: 0,
            message: "the kill task ended without an outcome".to_owned(),
        }),
    }
}

/// Kills every tree and waits until all are empty (shutdown).
pub(in crate::daemon) async fn kill_all(owner: &Rc<Owner>, reason: KillReason) {
    let trees = owner.daemon.registry.trees();
    let started = Instant::now();
    let pending: Vec<_> = trees
        .iter()
        .filter_map(|&tree| start_kill(owner, tree, None, reason))
        .collect();
    for kill in pending {
        let _ = outcome(kill).await;
    }
    tracing::info!(
        trees = trees.len(),
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "every tree killed"
    );
}
