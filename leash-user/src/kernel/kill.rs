//! The kill engine: doom the tree in the kernel, SIGTERM every member, wait the grace period,
//! then SIGKILL in rounds until the kernel says the tree has no members.
//!
//! Once doomed, any member that forks is killed by the fork program as it forks, so a fork
//! storm cannot outrun the rounds: each round can only shrink the tree. Signals go through
//! pidfds after checking the start time, so a recycled pid is never hit.

use std::{
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
const POLL: Duration = Duration::from_millis(1);

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
    /// From the start of the kill to an empty tree.
    pub elapsed: Duration,
}

impl Tracker {
    /// Kills every member of `tree`: SIGTERM, `grace` to exit, then SIGKILL rounds until it is
    /// empty. A zero grace goes straight to SIGKILL. The tree stays registered (doomed and
    /// empty) until it is released.
    pub fn kill(&mut self, tree: TreeId, grace: Duration) -> Result<KillReport> {
        let _span = tracing::info_span!("kill", tree, grace_ms = grace.as_millis()).entered();
        let started = Instant::now();
        self.doom(tree)?;
        let terminated = if grace.is_zero() {
            0
        } else {
            let sent = self.signal_members(tree, libc::SIGTERM)?;
            self.wait_empty(tree, grace)?;
            sent
        };
        let (mut killed, mut rounds) = (0, 0);
        let deadline = Instant::now() + KILL_ROUNDS_TIMEOUT;
        while !self.member_pids(tree)?.is_empty() {
            if Instant::now() >= deadline {
                bail!(
                    "tree {tree} still has members after {rounds} SIGKILL rounds in {:?}",
                    KILL_ROUNDS_TIMEOUT
                );
            }
            killed += self.signal_members(tree, libc::SIGKILL)?;
            rounds += 1;
            self.wait_empty(tree, ROUND_WAIT)?;
        }
        let report = KillReport {
            tree,
            terminated,
            killed,
            rounds,
            elapsed: started.elapsed(),
        };
        tracing::info!(?report, "tree is empty");
        Ok(report)
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

    /// Sends `signal` to every member that is still the process it was when it joined.
    /// Returns how many were signalled.
    fn signal_members(&self, tree: TreeId, signal: i32) -> Result<usize> {
        let mut sent = 0;
        for (pid, member) in self.member_entries()? {
            if member.tree != tree {
                continue;
            }
            // Gone already: its exit removes it from the map.
            let Ok(pidfd) = Pidfd::open(pid) else {
                continue;
            };
            // The pidfd was opened first, so if /proc still shows the member's start time the
            // pidfd names the member and not a process that reused its pid.
            let same = proc::process(pid)
                .is_some_and(|p| p.start_ticks == proc::ns_to_ticks(member.start_ns));
            if !same {
                tracing::debug!(pid, "not signalled: the pid names another process now");
                continue;
            }
            if pidfd.send_signal(signal).is_ok() {
                sent += 1;
            }
        }
        tracing::debug!(signal, sent, "signalled");
        Ok(sent)
    }

    /// Waits up to `timeout` for the kernel's member count of `tree` to reach zero.
    fn wait_empty(&self, tree: TreeId, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.tree_status(tree)?.members > 0 && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        Ok(())
    }
}
