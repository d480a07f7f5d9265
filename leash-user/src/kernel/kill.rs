//! The kill engine: doom the tree in the kernel, SIGTERM every member, wait the grace period,
//! then SIGKILL in rounds until the kernel says the tree has no members, then wait until every
//! member it signalled has finished exiting.
//!
//! A member leaves the map at `sched_process_exit`, early in the kernel's exit path: it runs no
//! more code of its own, but it still holds its memory, files, sockets and locks, and is still
//! in its cgroup, until it becomes a zombie. "Empty" is promised to hosts that may restart the
//! agent at once (same port, same lock files), so the kill ends only when those are released.
//!
//! Once doomed, any member that forks is killed by the fork program as it forks, so a fork
//! storm cannot outrun the rounds: each round can only shrink the tree. The child of such a
//! fork is born into a doomed tree: the grace period is for existing members' own cleanup, so
//! it gets SIGKILL as soon as a step sees the tree's join count move, not SIGTERM and a grace.
//! Signals go through pidfds of the very process each member entry names (pid and start
//! time), so a recycled pid is never hit.
//!
//! Every step is short whatever the tree's size, so that one driver can interleave a kill with
//! other work: a search queues the members that need a signal, and each step signals at most
//! [`SIGNALS_PER_STEP`] of them. An entry checked long after its search is still safe to
//! signal: the pidfd is opened first and the entry (or /proc) checked after, as for a fresh one.
//! A round's steps go out as one burst all the same: from its search to its last signal, the
//! processes it wakes are kept from taking the sender's CPU (see `KillTarget::burst`), so they
//! die together, as after cgroup.kill, rather than one at a time between the signals. Only a
//! kill's first [`BURST_SIGNALS`] signals do: a larger tree's exits need the CPUs more than
//! its signals do. The burst belongs to the thread that steps the kill: a `Kill` stays on its
//! thread.
//!
//! A search costs what the tree costs, not what the map holds (see `search`). A walk of the
//! whole map also runs at least every [`FULL_ROUND_EVERY`] while members are left.

mod search;
mod signal;
mod target;
#[cfg(test)]
mod tests;
mod types;

use std::{
    collections::{HashMap, VecDeque},
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;
use leash_common::TreeId;
use signal::{Signal, signal_member};
use target::KillTarget;
use types::{
    BURST_SIGNALS, EXIT_CHECKS_PER_STEP, FIRST_WALK_AFTER, FULL_ROUND_EVERY, POLL, Phase, Queued,
    ROUND_WAIT, Search, kernel_kill_pays, rounds_from,
};
pub use types::{KILL_ROUNDS_TIMEOUT, KillError, KillReport, KillStep, SIGNALS_PER_STEP};

use super::tracker::Tracker;
use crate::proc::ProcessRef;

/// A kill in progress, advanced one step at a time by whoever owns the tracker, so a daemon
/// can drive many kills while holding the tracker only for each short step.
#[derive(Debug)]
pub struct Kill {
    tree: TreeId,
    grace: Duration,
    started: Instant,
    phase: Phase,
    terminated: usize,
    killed: usize,
    rounds: u32,
    /// Every member signalled, and whether it was sent SIGKILL.
    signalled: HashMap<ProcessRef, bool>,
    /// Members a walk found to signal, not signalled yet: SIGKILLs ahead of SIGTERMs.
    queue: VecDeque<Queued>,
    /// When the tree was doomed (boot-time ns): members that started later were born doomed.
    doomed_ns: u64,
    /// Held from the search of a round to its last signal (see [`KillTarget::burst`]).
    burst: Option<Box<dyn std::any::Any>>,
    /// Whether a SIGKILL round may signal from the kernel, where the kernel kill is in place.
    kernel_kill: bool,
}

impl Kill {
    pub fn new(tree: TreeId, grace: Duration) -> Self {
        Self {
            tree,
            grace,
            started: Instant::now(),
            phase: Phase::Start,
            terminated: 0,
            killed: 0,
            rounds: 0,
            signalled: HashMap::new(),
            queue: VecDeque::new(),
            doomed_ns: 0,
            burst: None,
            kernel_kill: true,
        }
    }

    /// The same kill, signalling member by member through pidfds even where the kernel kill
    /// is in place: the way of kernels before 6.13, in steps of [`SIGNALS_PER_STEP`].
    pub fn without_kernel_kill(mut self) -> Self {
        self.kernel_kill = false;
        self
    }

    /// What the kill has done so far (its report, once it is done).
    pub fn report(&self) -> KillReport {
        KillReport {
            tree: self.tree,
            terminated: self.terminated,
            killed: self.killed,
            rounds: self.rounds,
            elapsed: self.started.elapsed(),
        }
    }

    /// Shortens the grace period to `grace` if that is shorter (a later kill, the lease's end
    /// or root asks for less); never lengthens it.
    pub fn shorten_grace(&mut self, grace: Duration) {
        if grace >= self.grace {
            return;
        }
        self.grace = grace;
        if let Phase::Grace { until, .. } = &mut self.phase {
            *until = (*until).min(self.started + grace);
        }
    }

    pub fn step(&mut self, tracker: &mut Tracker) -> Result<KillStep, KillError> {
        let step = self.step_on(tracker);
        // What the step drew from the reserve of descriptors, if anything, is taken up again.
        crate::sys::refill_reserve();
        step
    }

    /// [`Kill::step`] on any [`KillTarget`]: the tracker, or a fake.
    fn step_on<T: KillTarget>(&mut self, target: &mut T) -> Result<KillStep, KillError> {
        let tree = self.tree;
        self.advance(target)
            .map_err(|e| match e.downcast::<KillError>() {
                Ok(e) => e,
                Err(e) => KillError::Kernel {
                    tree,
                    message: format!("{e:#}"),
                },
            })
    }

    fn advance<T: KillTarget>(&mut self, tracker: &mut T) -> Result<KillStep> {
        let tree = self.tree;
        let now = tracker.now();
        match self.phase {
            Phase::Start => {
                self.doomed_ns = tracker.doom(tree)?;
                if self.grace.is_zero() {
                    // Straight to the first round, without a pause.
                    self.phase = rounds_from(now);
                    self.round(tracker, now, Search::Index)?;
                } else {
                    // Members born doomed (after the doom, before this search) get SIGKILL.
                    let newborn = Signal::TermOrKillNewborn(self.doomed_ns);
                    let enqueued = self.enqueue(tracker, newborn, Search::Index)?;
                    self.phase = Phase::Grace {
                        until: now + self.grace,
                        joined: enqueued.joined,
                    };
                }
            }
            Phase::Grace { until, joined } => {
                if emptied(tracker, tree)? {
                    return Ok(self.exiting(now));
                }
                if now >= until {
                    // The grace is over, perhaps shortened before every SIGTERM went out: the
                    // round sends SIGKILL to every member, those still queued for SIGTERM too.
                    self.queue.clear();
                    self.phase = rounds_from(now);
                    self.round(tracker, now, Search::Index)?;
                } else {
                    // A member forked (and died of it, in the kernel): its child was born
                    // doomed and does not get the grace period.
                    if tracker.tree_status(tree)?.joined != joined {
                        let newborn = Signal::KillNewborn(self.doomed_ns);
                        let enqueued = self.enqueue(tracker, newborn, Search::Index)?;
                        self.phase = Phase::Grace {
                            until,
                            joined: enqueued.joined,
                        };
                    }
                }
            }
            Phase::Rounds {
                next_round,
                next_full_round,
                joined,
                give_up,
            } => {
                if emptied(tracker, tree)? {
                    return Ok(self.exiting(now));
                }
                // Not while a round is still being sent: the members left have not all had
                // their SIGKILL yet.
                if now >= give_up && self.queue.is_empty() {
                    return Err(KillError::Unkillable {
                        tree,
                        remaining: tracker.tree_status(tree)?.members,
                        rounds: self.rounds,
                    }
                    .into());
                }
                // A round begins once the last one's queue is worked through: a search of the
                // index for newborns, or now and then a walk of the map whatever happened.
                if self.queue.is_empty() && now >= next_round {
                    if tracker.tree_status(tree)?.joined != joined {
                        self.round(tracker, now, Search::Index)?;
                    } else if now >= next_full_round {
                        self.round(tracker, now, Search::Walk)?;
                    }
                }
            }
            Phase::Exiting { give_up, .. } => return Ok(self.await_exits(tracker, now, give_up)),
        }
        self.signal_queued(tracker)?;
        if self.queue.is_empty() {
            Ok(KillStep::Wait(POLL))
        } else {
            // More to signal: step again at once, after whatever else the driver has to do.
            Ok(KillStep::Wait(Duration::ZERO))
        }
    }

    /// Begins a SIGKILL round: queues every member, as `search` finds them now. Where the
    /// kernel kill is in place, it then signals them all from the kernel, in one pass, and the
    /// queue is taken as sent.
    fn round<T: KillTarget>(
        &mut self,
        tracker: &mut T,
        now: Instant,
        search: Search,
    ) -> Result<()> {
        let enqueued = self.enqueue(tracker, Signal::Kill, search)?;
        if self.kernel_kill
            && kernel_kill_pays(self.queue.len())
            && let Some(signalled) = tracker.kernel_kill(self.tree, libc::SIGKILL)?
        {
            self.sent_from_the_kernel(signalled);
        }
        let Phase::Rounds {
            next_round,
            next_full_round,
            joined,
            ..
        } = &mut self.phase
        else {
            return Ok(());
        };
        // Read before the search: whoever joined during it makes the next round run.
        *joined = enqueued.joined;
        *next_round = now + ROUND_WAIT;
        if enqueued.walked || *next_full_round <= now {
            let until_walk = if self.rounds == 0 {
                FIRST_WALK_AFTER
            } else {
                FULL_ROUND_EVERY
            };
            *next_full_round = now + until_walk;
        }
        self.rounds += 1;
        tracing::debug!(
            round = self.rounds,
            queued = enqueued.count,
            walked = enqueued.walked,
            "SIGKILL round"
        );
        Ok(())
    }

    /// Takes every queued SIGKILL as sent: the kernel kill, run after the search that queued
    /// them, signalled every member the map held then (`signalled` of them), each one queued
    /// among them unless it had left meanwhile. What joined after the pass is found by the
    /// next round's search.
    fn sent_from_the_kernel(&mut self, signalled: u32) {
        let mut taken = 0;
        for Queued { pid, member, .. } in self.queue.drain(..) {
            let process = ProcessRef::of_member(pid, &member);
            if self.signalled.insert(process, true) != Some(true) {
                self.killed += 1;
                taken += 1;
            }
        }
        self.burst = None;
        tracing::debug!(
            tree = self.tree,
            signalled,
            taken,
            "SIGKILL from the kernel"
        );
    }

    /// Signals the next [`SIGNALS_PER_STEP`] queued members.
    fn signal_queued<T: KillTarget>(&mut self, tracker: &mut T) -> Result<()> {
        if self.queue.is_empty() {
            self.burst = None;
            return Ok(());
        }
        let take = self.queue.len().min(SIGNALS_PER_STEP);
        let mut deferred = 0;
        for Queued {
            pid,
            member,
            signal,
        } in self.queue.drain(..take)
        {
            let process = ProcessRef::of_member(pid, &member);
            // Queued twice (a newborn, by two walks), or already sent as much by now.
            match self.signalled.get(&process) {
                Some(true) => continue,
                Some(false) if signal == libc::SIGTERM => continue,
                _ => {}
            }
            let Some(sent) = signal_member(tracker, pid, member, signal)? else {
                // It stays in the map, unsignalled: a later round finds it again.
                deferred += 1;
                continue;
            };
            if sent {
                self.signalled.insert(process, signal == libc::SIGKILL);
                if signal == libc::SIGKILL {
                    self.killed += 1;
                } else {
                    self.terminated += 1;
                }
            }
        }
        if self.queue.is_empty() || self.killed + self.terminated >= BURST_SIGNALS {
            self.burst = None;
        }
        if deferred > 0 {
            tracing::warn!(
                tree = self.tree,
                deferred,
                "members could not be opened now (out of descriptors or memory?); a later \
                 round signals them"
            );
        }
        // A round's wait for its members to die starts when the last of them was signalled.
        if self.queue.is_empty()
            && let Phase::Rounds { next_round, .. } = &mut self.phase
        {
            *next_round = tracker.now() + ROUND_WAIT;
        }
        Ok(())
    }

    /// Takes the members that have finished exiting off the list, from its end, and stops at
    /// the first one still exiting: they all die at much the same pace, and checking every one
    /// again at each poll would take the CPUs from their exits. Done when the list is empty.
    fn await_exits<T: KillTarget>(
        &mut self,
        tracker: &T,
        now: Instant,
        give_up: Instant,
    ) -> KillStep {
        let Phase::Exiting { pending, .. } = &mut self.phase else {
            return KillStep::Wait(Duration::ZERO);
        };
        let mut one_still_exiting = false;
        for _ in 0..EXIT_CHECKS_PER_STEP {
            let Some(&last) = pending.last() else { break };
            if !tracker.has_exited(last) {
                one_still_exiting = true;
                break;
            }
            pending.pop();
        }
        let still_exiting = pending.len();
        if still_exiting == 0 {
            return KillStep::Done(self.report());
        }
        if now >= give_up {
            // They run no code of their own any more (the map is empty); something in the
            // kernel holds them. Not worth failing the kill for.
            tracing::warn!(
                tree = self.tree,
                still_exiting,
                "members have not finished exiting after {KILL_ROUNDS_TIMEOUT:?}"
            );
            return KillStep::Done(self.report());
        }
        if one_still_exiting {
            KillStep::Wait(POLL)
        } else {
            // Every one checked this step had exited: go on with the rest at once.
            KillStep::Wait(Duration::ZERO)
        }
    }

    /// The counters say the tree is empty: wait for the signalled members to finish exiting.
    fn exiting(&mut self, now: Instant) -> KillStep {
        // Whatever is still queued left the map: nothing to signal.
        self.queue.clear();
        self.burst = None;
        let pending: Vec<_> = self.signalled.drain().map(|(member, _)| member).collect();
        tracing::debug!(
            tree = self.tree,
            elapsed_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            signalled = pending.len(),
            "no members left in the map; waiting for them to finish exiting"
        );
        self.phase = Phase::Exiting {
            pending,
            give_up: now + KILL_ROUNDS_TIMEOUT,
        };
        KillStep::Wait(Duration::ZERO)
    }
}

/// Whether `tree` has no members left: the counters say so, and still say so once the marked
/// processes the member map lacked were put in (a doomed tree's members fork nothing where the
/// marks are, so once every marked process was signalled, a last pass finds what forked before
/// the doom and came after the search: the same reasoning as cgroup.kill's).
fn emptied<T: KillTarget>(tracker: &mut T, tree: TreeId) -> Result<bool> {
    if !tracker.counted_empty(tree)? {
        return Ok(false);
    }
    tracker.reconcile()?;
    tracker.counted_empty(tree)
}

impl Tracker {
    /// Kills every member of `tree`: SIGTERM, `grace` to exit, then SIGKILL rounds until it is
    /// empty. A zero grace goes straight to SIGKILL. The tree stays registered (doomed and
    /// empty) until it is released.
    pub fn kill(&mut self, tree: TreeId, grace: Duration) -> Result<KillReport> {
        let _span = tracing::info_span!("kill", tree, grace_ms = grace.as_millis()).entered();
        let mut kill = Kill::new(tree, grace);
        loop {
            match kill.step(self)? {
                KillStep::Wait(pause) => thread::sleep(pause),
                KillStep::Done(report) => {
                    tracing::info!(
                        tree = report.tree,
                        terminated = report.terminated,
                        killed = report.killed,
                        rounds = report.rounds,
                        elapsed_ms = u64::try_from(report.elapsed.as_millis()).unwrap_or(u64::MAX),
                        "tree is empty"
                    );
                    return Ok(report);
                }
            }
        }
    }
}
