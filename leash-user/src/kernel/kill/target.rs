//! What a kill needs of the kernel: the tree's entries in the maps, and the processes they
//! name. The real ones are the tracker's BPF maps and pidfds; the unit tests put a fake in their
//! place, so the kill's steps run on a CPU alone.

use std::{io, time::Instant};

use anyhow::Result;
use leash_common::{Member, Pid, TreeId};

use crate::{
    kernel::{tracker::Tracker, types::TreeStatus, view::TrackerView},
    proc::{self, ProcessRef},
    sys::{self, Pidfd},
};

/// The map operations and process operations a [`Kill`](super::Kill) makes, and its clock.
pub(super) trait KillTarget {
    /// A handle on one process, which names it for good (a pidfd).
    type Process;
    /// Held while a round's signals go out (see [`KillTarget::burst`]).
    type Burst: 'static;

    /// Now, on the clock the kill's deadlines (grace, rounds, give-up) are measured with.
    fn now(&self) -> Instant;

    /// Marks `tree` doomed (see [`Tracker::doom`]); returns when it was first doomed, in
    /// boot-time ns.
    fn doom(&mut self, tree: TreeId) -> Result<u64>;

    /// The kernel's counters of `tree`: its members now, and how many ever joined at fork.
    fn tree_status(&self, tree: TreeId) -> Result<TreeStatus>;

    /// Whether the kernel's counters say `tree` has no members left. They are exact: each
    /// program counts a member in or out right after it changes the map, and a member that
    /// forks is alive, and counted, until its child has been counted in.
    fn counted_empty(&self, tree: TreeId) -> Result<bool>;

    /// Every entry of the member map now: a walk of the whole map, all trees'.
    fn member_entries(&self) -> Result<Vec<(Pid, Member)>>;

    /// The members of `tree` that the index of each tree's pids knows of, each looked up in the
    /// map now (only those whose entry is in `tree`; a pid found outside it leaves the index).
    /// It may lack members (see `kernel::index`).
    fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)>;

    /// Sets the index's pids of `tree` to `members`, what a walk of the map just found.
    fn reindex(&mut self, tree: TreeId, members: &[(Pid, Member)]);

    /// Takes out `pid`'s entry if it is still `stale`, whose process is gone (see
    /// [`Tracker::drop_stale`]).
    fn drop_stale(&mut self, pid: Pid, stale: Member) -> Result<()>;

    /// The member map's entry for `pid` now.
    fn member(&self, pid: Pid) -> Option<Member>;

    /// Puts every marked process the member map lacks into it, where the marks are in place
    /// (see [`Tracker::reconcile`]): a fork the fork programs were skipped for is then a
    /// member the kill finds. Nothing where they are not.
    fn reconcile(&mut self) -> Result<()>;

    /// Sends `signal` to every member of `tree` from the kernel, in one pass (see
    /// [`crate::kernel::Descent::kill`]): how many it signalled, or None where the kernel kill
    /// is not in place.
    fn kernel_kill(&mut self, tree: TreeId, signal: i32) -> Result<Option<u32>>;

    /// Whether `process` carries a mark of `tree` as registered now: proof that it is a member
    /// of `tree` (see [`Tracker::marked_in`]). None where the marks are not in place or it has
    /// none.
    fn marked_in(&self, process: &Self::Process, tree: TreeId) -> Option<bool>;

    /// Whether the kernel has run some exit program for every exit so far (see
    /// [`crate::kernel::ProgramSkips::every_exit_seen`]).
    fn every_exit_seen(&self) -> bool;

    /// A handle on whatever process `pid` names now (pidfd_open); an error that
    /// [`proc::is_gone`] accepts if none.
    fn open(&self, pid: Pid) -> io::Result<Self::Process>;

    /// The start time (clock ticks since boot) of whatever process `pid` names now, from /proc;
    /// None if none.
    fn start_ticks(&self, pid: Pid) -> io::Result<Option<u64>>;

    /// Sends `signal` to the process `process` names.
    fn send_signal(&self, process: &Self::Process, signal: i32) -> io::Result<()>;

    /// While the returned value is held, the processes the signals wake do not run on this
    /// CPU before the kill has sent the rest (held from a round's search to its last signal).
    fn burst(&self) -> Self::Burst;

    /// Whether `process` has finished exiting (see [`ProcessRef::has_exited`]).
    fn has_exited(&self, process: ProcessRef) -> bool;
}

/// The real maps and processes.
impl KillTarget for Tracker {
    type Process = Pidfd;
    type Burst = sys::Unpreempted;

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn doom(&mut self, tree: TreeId) -> Result<u64> {
        Ok(Tracker::doom(self, tree)?)
    }

    fn tree_status(&self, tree: TreeId) -> Result<TreeStatus> {
        TrackerView::tree_status(self, tree)
    }

    fn counted_empty(&self, tree: TreeId) -> Result<bool> {
        Ok(TrackerView::tree_status(self, tree)?.members == 0)
    }

    fn member_entries(&self) -> Result<Vec<(Pid, Member)>> {
        TrackerView::member_entries(self)
    }

    fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)> {
        Tracker::indexed_members(self, tree)
    }

    fn reindex(&mut self, tree: TreeId, members: &[(Pid, Member)]) {
        Tracker::reindex(self, tree, members);
    }

    fn drop_stale(&mut self, pid: Pid, stale: Member) -> Result<()> {
        Ok(Tracker::drop_stale(self, pid, stale)?)
    }

    fn member(&self, pid: Pid) -> Option<Member> {
        TrackerView::member(self, pid)
    }

    fn reconcile(&mut self) -> Result<()> {
        Tracker::reconcile(self)?;
        Ok(())
    }

    fn kernel_kill(&mut self, tree: TreeId, signal: i32) -> Result<Option<u32>> {
        let Some(descent) = &self.descent else {
            return Ok(None);
        };
        // A kill never waits on it: the pidfds remain.
        Ok(descent.kill(tree, signal).unwrap_or_else(|e| {
            tracing::warn!(
                tree,
                "the kernel kill failed ({e:#}): signalling through pidfds"
            );
            None
        }))
    }

    fn marked_in(&self, process: &Pidfd, tree: TreeId) -> Option<bool> {
        Tracker::marked_in(self, process, tree)
    }

    fn every_exit_seen(&self) -> bool {
        TrackerView::every_exit_seen(self)
    }

    // The process operations draw on the daemon's reserve of descriptors (see
    // `sys::with_reserve`): a kill never waits for a descriptor a client holds.
    fn open(&self, pid: Pid) -> io::Result<Pidfd> {
        sys::with_reserve(|| Pidfd::open(pid))
    }

    fn start_ticks(&self, pid: Pid) -> io::Result<Option<u64>> {
        let now = sys::with_reserve(|| proc::read_process(pid))?;
        Ok(now.map(|now| now.start_ticks))
    }

    fn send_signal(&self, process: &Pidfd, signal: i32) -> io::Result<()> {
        process.send_signal(signal)
    }

    /// Real-time while the round goes out. A process that SIGKILL wakes has slept long and
    /// preempts whoever woke it: sent at normal priority, a round goes out one signal per
    /// exit, the sender and its victims taking turns on one CPU. Measured on 2 cores (1000
    /// sleeping processes, pidfd_open + pidfd_send_signal + close each): 85-99 us a process
    /// that way, all exited after 110-125 ms; real-time, 8 us a process, all exited after
    /// 77-97 ms, as they do after cgroup.kill. Only the whole round will do: real-time for
    /// each step of 256 signals, then normal, was no better than never.
    fn burst(&self) -> sys::Unpreempted {
        sys::Unpreempted::begin()
    }

    fn has_exited(&self, process: ProcessRef) -> bool {
        sys::with_reserve(|| process.exited()).unwrap_or(false)
    }
}
