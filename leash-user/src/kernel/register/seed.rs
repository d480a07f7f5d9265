//! Seeding: putting the processes a pass found into a tree, one by one, each checked again as
//! it goes in (it may have exited, or belong to another tree), and counted.

use std::time::Instant;

use leash_common::{Member, TreeId};

use crate::{
    kernel::{
        error::Error,
        maps::{BPF_EXIST, BPF_NOEXIST, SeedCounts},
        tracker::Tracker,
    },
    proc::{self, ProcessInfo},
};

/// What one call of [`Tracker::seed_until`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeedStep {
    /// How many of the processes it was given it went through, from the first: at least one,
    /// unless it was given none.
    pub taken: usize,
    /// How many of them are new members.
    pub new: usize,
    /// The files of /proc it read to check them.
    pub proc_reads: u64,
}

impl Tracker {
    /// Seeds into `tree` the processes a pass found (see [`find_descendants`]) that are not
    /// members of it yet, each checked again now (see `seed`). Returns how many are new
    /// members. One call seeds them all: a driver that must stay responsive calls
    /// [`Tracker::seed_until`].
    ///
    /// [`find_descendants`]: crate::kernel::TrackerView::find_descendants
    pub fn seed_found(&mut self, tree: TreeId, found: &[ProcessInfo]) -> Result<usize, Error> {
        Ok(self.seed_until(tree, found, None)?.new)
    }

    /// Seeds into `tree`, from the first, the processes a pass found (see [`find_descendants`])
    /// that are not members of it yet, each checked again now (see `seed`), until `deadline`
    /// has passed: it is checked after each process, so at least one is taken. Each costs a few
    /// map operations and a read of its /proc stat (tens of µs): a driver that must stay
    /// responsive sets a deadline a short time ahead, and calls again with the rest. Refuses a
    /// tree that is gone or doomed: a kill that saw its tree empty must not have members put in
    /// behind it.
    ///
    /// [`find_descendants`]: crate::kernel::TrackerView::find_descendants
    pub fn seed_until(
        &mut self,
        tree: TreeId,
        found: &[ProcessInfo],
        deadline: Option<Instant>,
    ) -> Result<SeedStep, Error> {
        let status = self.tree_status(tree)?;
        if status.doomed_ns.is_some() {
            return Err(Error::Doomed(tree));
        }
        let mut counts = SeedCounts::default();
        let mut step = SeedStep::default();
        let seeded = self.seed_each(tree, status.parent, found, deadline, &mut counts, &mut step);
        // Whatever happened: what was put in is counted.
        self.write_seed_counts(counts)?;
        seeded?;
        Ok(step)
    }

    /// Seeds `found` from the first until `deadline` (see [`Tracker::seed_until`]), telling
    /// `step` what it did.
    fn seed_each(
        &mut self,
        tree: TreeId,
        enclosing: Option<TreeId>,
        found: &[ProcessInfo],
        deadline: Option<Instant>,
        counts: &mut SeedCounts,
        step: &mut SeedStep,
    ) -> Result<(), Error> {
        for process in found {
            step.taken += 1;
            // The stat read that checks it, whatever came of it (see `seed_counted`).
            step.proc_reads += 1;
            if self.seed_counted(tree, enclosing, process, counts)? {
                step.new += 1;
            }
            // A vDSO call, not a system call: no cost beside the process's own.
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                break;
            }
        }
        Ok(())
    }

    /// Puts one process found in /proc into `tree`: a process no tree holds, or a member of
    /// the tree `tree` is nested in, which comes down into it. Returns whether it is now a
    /// member counted in `seeded`.
    pub(super) fn seed(&mut self, tree: TreeId, process: &ProcessInfo) -> Result<bool, Error> {
        let enclosing = self.tree_status(tree)?.parent;
        let mut counts = SeedCounts::default();
        let seeded = self.seed_counted(tree, enclosing, process, &mut counts);
        self.write_seed_counts(counts)?;
        seeded
    }

    /// [`Tracker::seed`] into `tree`, nested in `enclosing`, counted in `counts`.
    ///
    /// A new entry races with the process's exit, which is settled here: the kernel removes
    /// only what is in the map when the thread group dies, so the entry stays only if, after
    /// it was made, the pid still names the same process (start time) and some thread of it
    /// has not begun exiting. Otherwise the entry is taken out again: left in, it would name
    /// whatever process gets the pid next.
    fn seed_counted(
        &mut self,
        tree: TreeId,
        enclosing: Option<TreeId>,
        process: &ProcessInfo,
        counts: &mut SeedCounts,
    ) -> Result<bool, Error> {
        let room = !self.at_capacity_counting(counts);
        // Inserted first and looked up only if that fails: one map operation fewer for the
        // usual process, which no tree holds.
        if !room || !self.insert_new(tree, process) {
            return match self.member(process.pid) {
                Some(current) => self.move_down(tree, enclosing, process, current, counts),
                // Already a member, and gone since; or no room for it.
                None if room => Ok(false),
                None => Err(Error::MembersFull(self.capacity().members)),
            };
        }
        // The same process, alive after the insert: its group's death, whenever it comes, finds
        // the entry (see proc::group_alive).
        let still_there = proc::alive_start(process.pid) == Some(process.start_ticks);
        if still_there {
            self.count_seeded(counts, tree, 1)?;
            self.view.index.admit(tree, process.pid);
            self.mark_pid(process.pid, process.start_ticks, tree)?;
            return Ok(true);
        }
        if self.view.members.remove(&process.pid).is_err() {
            // The program removed it: it died after the insert and was counted as left.
            // Count it as seeded too, so seeded + joined - left stays true.
            self.count_seeded(counts, tree, 1)?;
        }
        Ok(false)
    }

    /// Makes an entry for `process` in `tree`, if the member map has none for its pid.
    fn insert_new(&mut self, tree: TreeId, process: &ProcessInfo) -> bool {
        let member = Member {
            tree,
            parent: process.ppid,
            start_ns: proc::ticks_to_ns(process.start_ticks),
        };
        self.view
            .members
            .insert(process.pid, member, BPF_NOEXIST)
            .is_ok()
    }

    /// Moves a member of the enclosing tree into `tree`, nested in it. Any other member stays
    /// where it is: one of `tree` already (the kernel saw it forked from one), or of another
    /// tree.
    fn move_down(
        &mut self,
        tree: TreeId,
        enclosing: Option<TreeId>,
        process: &ProcessInfo,
        current: Member,
        counts: &mut SeedCounts,
    ) -> Result<bool, Error> {
        let same = process.reference().is(&current);
        if Some(current.tree) != enclosing || !same {
            return Ok(false);
        }
        // Only if the entry is still there: one gone with its process stays gone.
        let moved = Member { tree, ..current };
        if self
            .view
            .members
            .insert(process.pid, moved, BPF_EXIST)
            .is_err()
        {
            return Ok(false);
        }
        self.count_seeded(counts, current.tree, -1)?;
        self.count_seeded(counts, tree, 1)?;
        self.view.index.remove(current.tree, process.pid);
        self.view.index.admit(tree, process.pid);
        self.mark_pid(process.pid, process.start_ticks, tree)?;
        Ok(true)
    }
}
