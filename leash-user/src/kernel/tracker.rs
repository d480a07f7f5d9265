//! The tracker: the programs, loaded and attached, and the maps it writes; what it hands to
//! other threads (a view of the maps, the whois iterator, the ring buffer's descriptor).

use std::{fmt, ops::Deref, os::fd::OwnedFd};

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf},
};
use leash_common::{Account, Member, Pid, TreeId};

use super::{
    descent::Descent,
    error::Error,
    link::HeldLink,
    marks::{Marks, Membership},
    pin_lock::PinLock,
    pins::Pins,
    programs::Program,
    ptrace_guard::Guard,
    record::TreeEvent,
    view::TrackerView,
    whois::Whois,
};

/// The loaded, attached programs and their maps. Dropping an unpinned tracker detaches and
/// unloads everything; a pinned one leaves its programs following forks into the pinned maps
/// until [`Tracker::unpin`].
pub struct Tracker {
    /// The maps clients read, which the tracker writes through too.
    pub(super) view: TrackerView,
    pub(super) events: RingBuf<MapData>,
    pub(super) account_joined: HashMap<MapData, Account, i64>,
    pub(super) account_seeded: HashMap<MapData, Account, i64>,
    /// Hosts watched for their death (see hosts.rs), with their start times.
    pub(super) hosts: HashMap<MapData, Pid, u64>,
    pub(super) next_tree: TreeId,
    /// The generation the last tree registered got (see `TreeControl::generation`).
    pub(super) next_generation: u32,
    /// The marks, where they are in place (see [`Membership`]).
    pub(super) marks: Option<Marks>,
    /// The fork programs' skips when [`Tracker::reconcile_after_skips`] last looked.
    pub(super) fork_misses_seen: u64,
    pub(super) pins: Option<Pins>,
    /// The pin directory's lock, held as long as this tracker (see `pin_lock`): after
    /// [`Tracker::unpin`] too, until the programs are gone.
    pub(super) pin_lock: Option<PinLock>,
    pub(super) whois: std::sync::Arc<Whois>,
    /// The descent iterator, where it attached (see `kernel::descent`).
    pub(super) descent: Option<std::sync::Arc<Descent>>,
    /// The ptrace guard in place (pinned, or held below).
    pub(super) guard: Guard,
    /// The programs attached (see [`Tracker::programs`]).
    pub(super) programs: Vec<&'static Program>,
    /// The links this process holds: all of them unpinned, or those the kernel cannot pin
    /// (classic tracepoints before Linux 5.15).
    pub(super) _links: Vec<HeldLink>,
    // Holds the programs and (unpinned) their links. None when taken over from pins: the
    // pinned links hold the programs then.
    pub(super) _programs: Option<Ebpf>,
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("capacity", &self.view.capacity())
            .finish_non_exhaustive()
    }
}

/// The tracker reads through its own view, so every read is written once, in [`TrackerView`],
/// and `tracker.tree_status(tree)` reads the same as `view.tree_status(tree)`. Writes go
/// through `self.view`'s maps explicitly: a view hands out no way to write.
impl Deref for Tracker {
    type Target = TrackerView;

    fn deref(&self) -> &TrackerView {
        &self.view
    }
}

impl Tracker {
    /// Removes the pins (a clean shutdown): the programs detach when this tracker is dropped.
    pub fn unpin(&mut self) -> Result<()> {
        match (self.pins.take(), &self.pin_lock) {
            (Some(pins), Some(lock)) => pins.remove_all(lock),
            _ => Ok(()),
        }
    }

    /// The ptrace guard in place.
    pub fn ptrace_guard(&self) -> Guard {
        self.guard
    }

    /// The programs attached, as `status` lists them: every tracker and guard, the whois
    /// iterator left out.
    pub fn programs(&self) -> Vec<&'static Program> {
        self.programs.clone()
    }

    /// The membership guarantee in place.
    pub fn membership(&self) -> Membership {
        Marks::membership(self.marks.as_ref())
    }

    /// [`Tracker::reconcile_now`], where the kernel has skipped a fork program since this
    /// tracker's programs were loaded: only then can a fork have gone unseen. The kernel counts
    /// every skip, so a kernel that runs them with preemption off (before 7.0) never pays for
    /// the pass. Returns whether it ran.
    pub fn reconcile(&self) -> Result<bool, Error> {
        if self.view.fork_misses() == 0 {
            return Ok(false);
        }
        self.reconcile_now()
    }

    /// Puts into the member map the processes it lacks, a fork the fork programs were skipped
    /// for: where the marks are in place, every marked process (and every member's thread gets
    /// its process's mark); elsewhere, every process whose nearest tracked ancestor is a member
    /// (see `kernel::descent`), which finds a missed child while its parent lives. One pass
    /// over the machine's tasks (about 0.3 µs each). Returns whether it ran.
    pub fn reconcile_now(&self) -> Result<bool, Error> {
        if let Some(marks) = &self.marks {
            marks.reconcile().map_err(Error::Reconcile)?;
            return Ok(true);
        }
        let Some(descent) = &self.descent else {
            return Ok(false);
        };
        let reading = descent.reconcile()?;
        if reading.added > 0 {
            tracing::info!(
                added = reading.added,
                "reconciled by ancestry: members' children the fork programs missed"
            );
        }
        Ok(true)
    }

    /// Reconciles (see [`Tracker::reconcile`]) if the kernel skipped a fork program since the
    /// last time this looked: a fork may have gone unseen, and its child is put in the map now,
    /// where the events and `list` see it, not only when its tree is killed.
    pub fn reconcile_after_skips(&mut self) -> Result<bool, Error> {
        if self.marks.is_none() && self.descent.is_none() {
            return Ok(false);
        }
        let misses = self.view.fork_misses();
        if misses == self.fork_misses_seen {
            return Ok(false);
        }
        self.fork_misses_seen = misses;
        self.reconcile_now()
    }

    /// Marks the process `pid`, which started at `start_ticks` (/proc's), a member of `tree`,
    /// where the marks are in place: its children are then marked in the kernel as they are
    /// made. A pidfd is opened first and the start time checked after, so a recycled pid is
    /// never marked. Best effort: a process user space put in and could not mark is still in
    /// the member map, whence `task_alloc` takes its children's mark, and a kill checks it
    /// against /proc instead; a process gone meanwhile is settled where its entry was made.
    pub(super) fn mark_pid(&self, pid: Pid, start_ticks: u64, tree: TreeId) -> Result<(), Error> {
        let Some(marks) = &self.marks else {
            return Ok(());
        };
        let Ok(process) = crate::sys::Pidfd::open(pid) else {
            return Ok(());
        };
        if crate::proc::alive_start(pid) != Some(start_ticks) {
            return Ok(());
        }
        let generation = self.view.control.get(&tree, 0)?.generation;
        match marks.set(&process, leash_common::Mark { tree, generation }) {
            Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                tracing::warn!(pid, tree, "cannot mark a member: {e}");
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the process `process` names carries a mark of `tree` as registered now; None
    /// where the marks are not in place, or it has none (user space marks what it puts in,
    /// but a process put in before the marks were there has none).
    pub(super) fn marked_in(&self, process: &crate::sys::Pidfd, tree: TreeId) -> Option<bool> {
        let mark = self.marks.as_ref()?.of(process).ok()??;
        let generation = self.view.control.get(&tree, 0).ok()?.generation;
        Some(mark.tree == tree && mark.generation == generation)
    }

    /// A generation for a tree registered now: never one in use, nor 0, nor (but after
    /// bursts of more than 64 registrations a second, or 776 days of uptime) one an earlier
    /// daemon gave out. A released tree's processes live on with their marks, and a daemon
    /// that takes over sees only the live trees' generations: were a new tree under a released
    /// one's id to get that tree's generation too, those processes would be its members. So
    /// generations follow the boot clock, in 64ths of a second, and the last one given out.
    pub(super) fn new_generation(&mut self) -> u32 {
        let clock = (crate::sys::boottime_ns() / (1_000_000_000 / 64)) as u32;
        self.next_generation = self.next_generation.wrapping_add(1).max(clock).max(1);
        self.next_generation
    }

    /// The highest generation of the trees registered now.
    pub(super) fn highest_generation(&self) -> u32 {
        self.trees()
            .iter()
            .filter_map(|&tree| self.view.control.get(&tree, 0).ok())
            .map(|control| control.generation)
            .max()
            .unwrap_or(0)
    }

    /// Where the pins are, if this tracker is pinned.
    pub fn pin_dir(&self) -> Option<&std::path::Path> {
        self.pins.as_ref().map(Pins::dir)
    }

    /// What the kernel knows of a process that /proc does not tell (its namespaces), for any
    /// thread to ask.
    pub fn whois(&self) -> std::sync::Arc<Whois> {
        self.whois.clone()
    }

    /// Whether a kill's SIGKILL rounds signal from the kernel, in one pass (the kfunc
    /// `bpf_send_signal_task`, Linux 6.13), rather than member by member through pidfds.
    pub fn kernel_kill(&self) -> bool {
        self.descent.as_ref().is_some_and(|descent| descent.kills())
    }

    /// The descent iterator, for adoptions' passes on any thread; None where it did not attach
    /// (adoptions walk /proc then).
    pub fn descent(&self) -> Option<std::sync::Arc<Descent>> {
        self.descent.clone()
    }

    /// A view of the maps for readers on other threads: new descriptors of the same maps, so
    /// it sees every write the tracker makes, at once, and needs no lock.
    pub fn shared_view(&self) -> Result<TrackerView> {
        self.view.duplicate()
    }

    /// Takes every event waiting in the ring buffer, and keeps the index of each tree's pids
    /// up to date with them. Best effort: see `Stats::events_dropped`.
    pub fn drain_events(&mut self) -> Vec<TreeEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            events.extend(TreeEvent::decode(&item));
        }
        let TrackerView { members, index, .. } = &mut self.view;
        index.take_records(&events, |pid| members.get(&pid, 0).ok());
        events
    }

    /// The members of `tree` the index of each tree's pids knows of, each looked up in the
    /// map now (see [`MemberIndex::members_of`](super::index::MemberIndex::members_of)).
    pub(super) fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)> {
        let TrackerView { members, index, .. } = &mut self.view;
        index.members_of(tree, |pid| members.get(&pid, 0).ok())
    }

    /// Sets the index's pids of `tree` to those a walk of the map just found.
    pub(super) fn reindex(&mut self, tree: TreeId, found: &[(Pid, Member)]) {
        self.view
            .index
            .replace(tree, found.iter().map(|&(pid, _)| pid));
    }

    /// A descriptor that polls readable when events are waiting (a duplicate of the ring
    /// buffer's, so it can be watched without holding the tracker).
    pub fn events_fd(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.events.as_fd().try_clone_to_owned()
    }
}
