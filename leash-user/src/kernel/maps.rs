//! The tracker's writes to the maps: trees made, doomed and released, members counted.

use std::collections::HashMap as StdHashMap;

use aya::maps::{HashMap, MapData};
use leash_common::{ALL_ACCOUNTS, Account, Holder, Member, Pid, TreeControl, TreeCounters, TreeId};

use super::{error::Error, tracker::Tracker};
use crate::{
    proc::{self, ProcessRef},
    sys,
};

/// `bpf_map_update_elem`'s flags: only a new entry, only an existing one.
pub(super) const BPF_NOEXIST: u64 = 1;
pub(super) const BPF_EXIST: u64 = 2;

impl Tracker {
    /// Marks `tree` doomed: from now on any member that forks is killed in the kernel, and its
    /// child is killed as soon as user space sees it. Returns when it was first doomed
    /// (boot-time ns): members that started after that were born into a doomed tree.
    pub fn doom(&mut self, tree: TreeId) -> Result<u64, Error> {
        let mut control = self
            .control
            .get(&tree, 0)
            .map_err(|_| Error::NoTree(tree))?;
        if control.flags & leash_common::flags::DOOMED == 0 {
            control.flags |= leash_common::flags::DOOMED;
            control.doomed_ns = sys::boottime_ns();
            self.view.control.insert(tree, control, 0)?;
        }
        Ok(control.doomed_ns)
    }

    /// Stops tracking `tree`. A tree nested in another hands its members back to it (they
    /// never go free by a release); a tree that stands alone lets them go. Trees nested in
    /// `tree` move up to where it was.
    pub fn release(&mut self, tree: TreeId) -> Result<(), Error> {
        let enclosing = self
            .tree_status(tree)
            .ok()
            .and_then(|status| status.parent)
            .filter(|&parent| self.control.get(&parent, 0).is_ok());
        for nested in self.nested(tree) {
            if let Ok(mut control) = self.control.get(&nested, 0) {
                control.parent = enclosing.unwrap_or(0);
                self.view.control.insert(nested, control, 0)?;
            }
        }
        match enclosing {
            Some(enclosing) => self.hand_back(tree, enclosing)?,
            None => {
                let mut removed = 0;
                for pid in self.member_pids(tree)? {
                    // Already gone: it exited meanwhile (and the program counted it).
                    if self.view.members.remove(&pid).is_ok() {
                        removed += 1;
                    }
                }
                self.add_seeded(tree, -removed)?;
            }
        }
        let account = self.holder(tree).map(|h| h.account).ok();
        let _ = self.view.counters.remove(&tree);
        let _ = self.view.control.remove(&tree);
        self.view.index.forget(tree);
        // The account's quota entries go with its last tree.
        if let Some(account) = account
            && !self
                .control
                .iter()
                .filter_map(Result::ok)
                .any(|(_, control)| control.holder.account == account)
        {
            let _ = self.account_joined.remove(&account);
            let _ = self.account_seeded.remove(&account);
        }
        tracing::debug!(tree, enclosing, "released");
        Ok(())
    }

    /// Moves every member of `tree` into `enclosing`. A member that forks meanwhile may make a
    /// child in `tree` after the walk passed: walk again until none is left. Each walk comes
    /// after a reconciling pass, where the marks are in place: a member the fork programs
    /// missed is marked with `tree` alone, a mark that counts for nothing once `tree` is gone.
    fn hand_back(&mut self, tree: TreeId, enclosing: TreeId) -> Result<(), Error> {
        for _ in 0..64 {
            self.reconcile()?;
            let members: Vec<(Pid, Member)> = self
                .member_entries()?
                .into_iter()
                .filter(|(_, m)| m.tree == tree)
                .collect();
            if members.is_empty() {
                return Ok(());
            }
            for (pid, member) in members {
                let back = Member {
                    tree: enclosing,
                    ..member
                };
                // Only an entry still there: one gone with its process stays gone.
                if self.view.members.insert(pid, back, BPF_EXIST).is_ok() {
                    self.add_seeded(enclosing, 1)?;
                    self.add_seeded(tree, -1)?;
                    self.mark_pid(pid, proc::ns_to_ticks(member.start_ns), enclosing)?;
                    self.view.index.admit(enclosing, pid);
                }
            }
        }
        Err(Error::HandBackRunaway { tree, enclosing })
    }

    pub(super) fn new_tree(
        &mut self,
        root: Pid,
        parent: Option<TreeId>,
        holder: Holder,
    ) -> Result<TreeId, Error> {
        let limit = self.capacity().trees;
        if self.trees().len() as u32 >= limit {
            return Err(Error::TreesFull(limit));
        }
        let tree = self.next_tree;
        self.next_tree = self.next_tree.checked_add(1).ok_or(Error::TreeIdsRanOut)?;
        // Counters first: the programs only ever add to an existing entry.
        let account = holder.account;
        if self.account_joined.get(&account, 0).is_err() {
            self.account_joined.insert(account, 0, BPF_NOEXIST)?;
            self.account_seeded.insert(account, 0, 0)?;
        }
        self.view
            .counters
            .insert(tree, TreeCounters::default(), BPF_NOEXIST)?;
        let control = TreeControl {
            root,
            parent: parent.unwrap_or(0),
            holder,
            generation: self.new_generation(),
            ..Default::default()
        };
        self.view.control.insert(tree, control, BPF_NOEXIST)?;
        Ok(tree)
    }

    /// Takes out `pid`'s entry if it is still `stale`, an entry whose process is gone, and
    /// counts it out of its tree (as a member user space took out, whoever put it in). Such an
    /// entry is one user space put in after its process had exited, or one whose exit the
    /// kernel skipped the exit programs for (see `program::FORK_AGAIN`).
    ///
    /// The fork programs take out such an entry themselves when its pid comes back as a
    /// member's child, and put the child's in: the entry taken out here is checked to be the
    /// stale one as it is taken (in one step, from 5.14), and another is put back. Before 5.14
    /// the kernel never skips the exit programs, and no fork program takes an entry out.
    pub(super) fn drop_stale(&mut self, pid: Pid, stale: Member) -> Result<(), Error> {
        if self.member(pid) != Some(stale) {
            return Ok(());
        }
        let removed = match self.view.take_member(pid) {
            Ok(removed) => removed,
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                self.view.members.remove(&pid).is_ok().then_some(stale)
            }
            Err(e) => return Err(Error::TakeMember(e)),
        };
        match removed {
            Some(removed) if removed == stale => {
                tracing::warn!(
                    pid,
                    tree = stale.tree,
                    "took out a member whose process is gone"
                );
                self.add_seeded(stale.tree, -1)?;
                self.view.index.remove(stale.tree, pid);
            }
            // A child's entry, put in since the check: it goes back.
            Some(other) => {
                let _ = self.view.members.insert(pid, other, BPF_NOEXIST);
            }
            None => {}
        }
        Ok(())
    }

    /// Whether `tree`'s root `root` has exited unseen: its entry is still in the map although
    /// the process has finished exiting, so the kernel skipped the exit programs for it (see
    /// `program::FORK_AGAIN`) and no root exit was recorded. The entry is taken out.
    pub fn root_exited_unseen(&mut self, tree: TreeId, root: Pid) -> Result<bool, Error> {
        let Some(entry) = self.member(root).filter(|entry| entry.tree == tree) else {
            return Ok(false);
        };
        let process = ProcessRef::of_member(root, &entry);
        // The exit programs run before a process finishes exiting: an entry still there after
        // that was missed (checked again as it is taken out).
        if !process.has_exited() {
            return Ok(false);
        }
        self.drop_stale(root, entry)?;
        Ok(true)
    }

    /// Counts `count` members put into `tree` by user space (negative: taken out), for the
    /// tree and for its account's quota.
    pub(super) fn add_seeded(&mut self, tree: TreeId, count: i64) -> Result<(), Error> {
        let mut control = self.control.get(&tree, 0)?;
        control.seeded += count;
        self.view.control.insert(tree, control, 0)?;
        for account in [control.holder.account, ALL_ACCOUNTS] {
            let seeded = self.account_seeded.get(&account, 0).unwrap_or(0);
            self.account_seeded.insert(account, seeded + count, 0)?;
        }
        Ok(())
    }

    /// Counts `count` members put into `tree` (negative: taken out) as seeded in the tree's
    /// count alone: the descent program counted them in the accounts as it put them in.
    pub(super) fn add_seeded_to_tree(&mut self, tree: TreeId, count: i64) -> Result<(), Error> {
        let mut control = self.control.get(&tree, 0)?;
        control.seeded += count;
        self.view.control.insert(tree, control, 0)?;
        Ok(())
    }

    /// Whether the trees have every member the capacity allows: user space puts no more in
    /// (the reserve beyond it is the programs', for children forked at the capacity).
    pub(super) fn at_capacity(&self) -> bool {
        let count = |map: &HashMap<MapData, Account, i64>| map.get(&ALL_ACCOUNTS, 0).unwrap_or(0);
        count(&self.account_joined) + count(&self.account_seeded)
            >= i64::from(self.capacity().members)
    }

    /// Counts `count` members put into `tree` by user space (negative: taken out), as
    /// [`Tracker::add_seeded`] does, in `counts`: the accounts' counts are written now, the
    /// tree's own when `counts` is written ([`Tracker::write_seed_counts`]).
    pub(super) fn count_seeded(
        &mut self,
        counts: &mut SeedCounts,
        tree: TreeId,
        count: i64,
    ) -> Result<(), Error> {
        let account = match counts.trees.get_mut(&tree) {
            Some((account, seeded)) => {
                *seeded += count;
                *account
            }
            None => {
                let account = self.control.get(&tree, 0)?.holder.account;
                counts.trees.insert(tree, (account, count));
                account
            }
        };
        for account in [account, ALL_ACCOUNTS] {
            let seeded = match counts.accounts.get(&account) {
                Some(&seeded) => seeded,
                None => self.account_seeded.get(&account, 0).unwrap_or(0),
            };
            self.account_seeded.insert(account, seeded + count, 0)?;
            counts.accounts.insert(account, seeded + count);
        }
        Ok(())
    }

    /// Writes the trees' counts that `counts` holds.
    pub(super) fn write_seed_counts(&mut self, counts: SeedCounts) -> Result<(), Error> {
        for (tree, (_, seeded)) in counts.trees {
            let mut control = self.control.get(&tree, 0)?;
            control.seeded += seeded;
            self.view.control.insert(tree, control, 0)?;
        }
        Ok(())
    }

    /// [`Tracker::at_capacity`], with the count of every member as `counts` knows it.
    pub(super) fn at_capacity_counting(&self, counts: &SeedCounts) -> bool {
        let Some(&seeded) = counts.accounts.get(&ALL_ACCOUNTS) else {
            return self.at_capacity();
        };
        let joined = self.account_joined.get(&ALL_ACCOUNTS, 0).unwrap_or(0);
        joined + seeded >= i64::from(self.capacity().members)
    }
}

/// Members seeded in a run of seeds, counted for less than [`Tracker::add_seeded`] costs for
/// each (six map operations). The accounts' counts, which the fork program reads for quotas
/// and the capacity, are still written at once for each member, but from the values written
/// last, kept here: user space is their only writer, and in it the tracker's owner. The trees'
/// counts, which only user space reads, are written once at the end: until then a tree being
/// seeded reads as having fewer members than it has.
#[derive(Debug, Default)]
#[must_use = "the trees' counts are written by Tracker::write_seed_counts"]
pub(super) struct SeedCounts {
    /// Each account's seeded count, as last written.
    accounts: StdHashMap<Account, i64>,
    /// Each tree's account, and the members counted into it.
    trees: StdHashMap<TreeId, (Account, i64)>,
}
