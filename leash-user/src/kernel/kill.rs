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
//! storm cannot outrun the rounds: each round can only shrink the tree. Signals go through
//! pidfds, checked against the member map, so a recycled pid is never hit.

use std::{
    collections::HashMap,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use leash_common::{Pid, TreeId};

use super::Tracker;
use crate::{proc, sys::Pidfd};

/// How long SIGKILL rounds may go on before the kill is reported as failed (a process stuck in
/// uninterruptible sleep can hold out that long).
pub const KILL_ROUNDS_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a round waits for the signalled members to die before the next round.
const ROUND_WAIT: Duration = Duration::from_millis(20);
/// A SIGKILL round walks the whole member map. After the first, one is needed only when a
/// member joined since the last began (a SIGKILLed process dies; sending again changes
/// nothing), but one runs at least this often all the same.
const FULL_ROUND_EVERY: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(1);
/// How many exiting members one step checks in /proc, so a step stays short at any tree size.
const EXIT_CHECKS_PER_STEP: usize = 1024;

/// What a kill did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillReport {
    pub tree: TreeId,
    /// Members sent SIGTERM.
    pub terminated: usize,
    /// SIGKILLs sent, over all rounds.
    pub killed: usize,
    /// SIGKILL rounds.
    pub rounds: u32,
    /// From the start of the kill to an empty tree whose members have finished exiting.
    pub elapsed: Duration,
}

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
    /// Every member signalled, with its start time in /proc's clock ticks.
    signalled: HashMap<Pid, u64>,
}

#[derive(Debug)]
enum Phase {
    Start,
    Grace {
        until: Instant,
    },
    Rounds {
        next_round: Instant,
        /// When a round runs even if no member joined.
        next_full_round: Instant,
        /// The tree's `joined` counter when the last round began.
        joined: u64,
        give_up: Instant,
    },
    /// The map is empty; these signalled members are still on their way out of the kernel.
    Exiting {
        pending: Vec<(Pid, u64)>,
        give_up: Instant,
    },
}

/// What the driver of a [`Kill`] does next.
#[derive(Debug)]
pub enum KillStep {
    /// Sleep this long, then step again.
    Wait(Duration),
    Done(KillReport),
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
        }
    }

    pub fn step(&mut self, tracker: &mut Tracker) -> Result<KillStep> {
        let tree = self.tree;
        let now = Instant::now();
        match self.phase {
            Phase::Start => {
                tracker.doom(tree)?;
                if self.grace.is_zero() {
                    // Straight to the first round, without a pause.
                    self.phase = rounds_from(now);
                    self.round(tracker, now)?;
                } else {
                    self.terminated =
                        tracker.signal_members(tree, libc::SIGTERM, &mut self.signalled)?;
                    self.phase = Phase::Grace {
                        until: now + self.grace,
                    };
                }
            }
            Phase::Grace { until } => {
                if tracker.is_empty(tree)? {
                    return Ok(self.exiting(now));
                }
                if now >= until {
                    self.phase = rounds_from(now);
                    self.round(tracker, now)?;
                }
            }
            Phase::Rounds {
                next_round,
                next_full_round,
                joined,
                give_up,
            } => {
                if tracker.is_empty(tree)? {
                    return Ok(self.exiting(now));
                }
                if now >= give_up {
                    bail!(
                        "tree {tree} still has members after {} SIGKILL rounds in {:?}",
                        self.rounds,
                        KILL_ROUNDS_TIMEOUT
                    );
                }
                let someone_joined = tracker.tree_status(tree)?.joined != joined;
                if now >= next_round && (someone_joined || now >= next_full_round) {
                    self.round(tracker, now)?;
                }
            }
            Phase::Exiting {
                ref mut pending,
                give_up,
            } => {
                // Check the last few; an exited one is swapped out for one already checked.
                let checked_from = pending.len().saturating_sub(EXIT_CHECKS_PER_STEP);
                for i in (checked_from..pending.len()).rev() {
                    let (pid, start_ticks) = pending[i];
                    if finished_exiting(pid, start_ticks) {
                        pending.swap_remove(i);
                    }
                }
                if pending.is_empty() {
                    return Ok(KillStep::Done(self.report()));
                }
                if now >= give_up {
                    // They run no code of their own any more (the map is empty); something in
                    // the kernel holds them. Not worth failing the kill for.
                    tracing::warn!(
                        tree,
                        still_exiting = pending.len(),
                        "members have not finished exiting after {KILL_ROUNDS_TIMEOUT:?}"
                    );
                    return Ok(KillStep::Done(self.report()));
                }
                if pending.len() > checked_from {
                    return Ok(KillStep::Wait(POLL));
                }
                // Every one checked this step had exited: go on with the rest at once.
                return Ok(KillStep::Wait(Duration::ZERO));
            }
        }
        Ok(KillStep::Wait(POLL))
    }

    /// One SIGKILL round: every member, as the map has them now.
    fn round(&mut self, tracker: &mut Tracker, now: Instant) -> Result<()> {
        let Phase::Rounds {
            next_round,
            next_full_round,
            joined,
            ..
        } = &mut self.phase
        else {
            return Ok(());
        };
        // Read before the walk: whoever joins during it makes the next round run.
        *joined = tracker.tree_status(self.tree)?.joined;
        *next_round = now + ROUND_WAIT;
        *next_full_round = now + FULL_ROUND_EVERY;
        let sent = tracker.signal_members(self.tree, libc::SIGKILL, &mut self.signalled)?;
        self.killed += sent;
        self.rounds += 1;
        tracing::debug!(
            round = self.rounds,
            sent,
            took = ?now.elapsed(),
            "SIGKILL round"
        );
        Ok(())
    }

    /// The map is empty: wait for the signalled members to finish exiting.
    fn exiting(&mut self, now: Instant) -> KillStep {
        let pending: Vec<_> = self.signalled.drain().collect();
        tracing::debug!(
            tree = self.tree,
            elapsed = ?self.started.elapsed(),
            signalled = pending.len(),
            "no members left in the map; waiting for them to finish exiting"
        );
        self.phase = Phase::Exiting {
            pending,
            give_up: now + KILL_ROUNDS_TIMEOUT,
        };
        KillStep::Wait(Duration::ZERO)
    }

    fn report(&self) -> KillReport {
        KillReport {
            tree: self.tree,
            terminated: self.terminated,
            killed: self.killed,
            rounds: self.rounds,
            elapsed: self.started.elapsed(),
        }
    }
}

fn rounds_from(now: Instant) -> Phase {
    Phase::Rounds {
        next_round: now,
        next_full_round: now,
        joined: 0,
        give_up: now + KILL_ROUNDS_TIMEOUT,
    }
}

/// Whether the member that `pid` named when it started at `start_ticks` has finished exiting.
/// A pidfd says so cheaply; /proc is read only for a process that has not, which may be the
/// member still exiting or a newer process that took its pid.
fn finished_exiting(pid: Pid, start_ticks: u64) -> bool {
    match Pidfd::open(pid) {
        // Reaped, and the pid not taken again.
        Err(_) => true,
        Ok(pidfd) => pidfd.has_exited() || proc::has_exited(pid, start_ticks),
    }
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
                    tracing::info!(?report, "tree is empty");
                    return Ok(report);
                }
            }
        }
    }

    /// Whether `tree` has no members. The kernel's count says so cheaply; the map walk
    /// confirms it (the map is the truth).
    pub fn is_empty(&self, tree: TreeId) -> Result<bool> {
        Ok(self.tree_status(tree)?.members == 0 && self.member_pids(tree)?.is_empty())
    }

    /// The pids of `tree`'s members, without reading /proc.
    pub fn member_pids(&self, tree: TreeId) -> Result<Vec<Pid>> {
        Ok(self
            .member_entries()?
            .into_iter()
            .filter(|(_, m)| m.tree == tree)
            .map(|(pid, _)| pid)
            .collect())
    }

    /// Sends `signal` to every member that is still the process it was when it joined, and
    /// notes each in `signalled`. Returns how many were signalled.
    fn signal_members(
        &self,
        tree: TreeId,
        signal: i32,
        signalled: &mut HashMap<Pid, u64>,
    ) -> Result<usize> {
        let mut sent = 0;
        for (pid, member) in self.member_entries()? {
            if member.tree != tree {
                continue;
            }
            // Gone already: its exit removes it from the map.
            let Ok(pidfd) = Pidfd::open(pid) else {
                continue;
            };
            // The pidfd was opened first. If the map still holds this very member (same start
            // time), the member had not exited when the pidfd was opened (its exit removes it,
            // and its pid cannot be reused before that), so the pidfd names the member and not
            // a process that reused its pid.
            let same = self.member(pid).is_some_and(|now| now == member);
            if !same {
                tracing::debug!(pid, "not signalled: the pid names another process now");
                continue;
            }
            if pidfd.send_signal(signal).is_ok() {
                sent += 1;
                signalled.insert(pid, proc::ns_to_ticks(member.start_ns));
            }
        }
        tracing::debug!(signal, sent, "signalled");
        Ok(sent)
    }
}
