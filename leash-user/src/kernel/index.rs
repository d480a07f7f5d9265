//! Which pids each tree has, as user space has heard: the members it put in itself, and the
//! ring buffer's fork and exit records. A kill reads its tree's members from here, so that
//! signalling a tree of n members costs O(n) lookups however many other processes are tracked,
//! where a walk of the member map costs a read of every entry of every tree (and a scan of the
//! whole hash table, however empty).
//!
//! It is a hint, never the truth. Records are best effort (dropped when the ring buffer is
//! full) and read late (the daemon collects them every 50 ms), so the index can lack members,
//! and keep pids that have left (an exit record dropped) or name other processes by now. Its
//! user therefore looks every pid up in the member map, and counts what it found against the
//! kernel's count of the tree before it trusts it (see `Kill`'s `find_members`); a pid it finds
//! outside the tree is taken out.
//!
//! Memory is bounded: a tree's pids go when the tree is released, a pid goes with its exit
//! record, and a tree whose set has grown to twice its size when it was last checked against
//! the map is checked again (what exit records were dropped leaves then), so no set outgrows
//! twice its tree for long. Records for a tree the index does not know (released, or made by a
//! daemon before a take-over) are ignored: a tree becomes known when user space puts a member
//! in it, or a kill has walked the map for it.

use std::collections::{HashMap, HashSet};

use leash_common::{EventKind, Member, Pid, TreeId};

use super::record::TreeEvent;

/// Below this, a set is never checked for growth: checking costs a lookup per pid.
const CHECK_ABOVE: usize = 64;

/// The pids of each known tree (see the module doc).
#[derive(Debug, Default)]
pub(super) struct MemberIndex {
    trees: HashMap<TreeId, Pids>,
    /// Trees whose set has grown enough to be checked against the map.
    overgrown: HashSet<TreeId>,
}

#[derive(Debug, Default)]
struct Pids {
    pids: HashSet<Pid>,
    /// How many it held when it was last checked against the map.
    checked: usize,
}

impl MemberIndex {
    /// `pid` was put into `tree` by user space (or moved there): the tree is known from now on.
    pub(super) fn admit(&mut self, tree: TreeId, pid: Pid) {
        self.trees.entry(tree).or_default().pids.insert(pid);
        self.note_growth(tree);
    }

    /// `pid` left `tree` (it exited, or user space took it out or moved it away).
    pub(super) fn remove(&mut self, tree: TreeId, pid: Pid) {
        if let Some(set) = self.trees.get_mut(&tree) {
            set.pids.remove(&pid);
        }
    }

    /// `tree` was released: nothing of it is kept.
    pub(super) fn forget(&mut self, tree: TreeId) {
        self.trees.remove(&tree);
        self.overgrown.remove(&tree);
    }

    /// Takes in a ring-buffer record: a fork into a known tree adds the child, an exit removes
    /// the member.
    pub(super) fn record(&mut self, event: &TreeEvent) {
        match event.kind {
            EventKind::Fork => {
                if let Some(set) = self.trees.get_mut(&event.tree) {
                    set.pids.insert(event.pid);
                    self.note_growth(event.tree);
                }
            }
            EventKind::Exit | EventKind::RootExit => self.remove(event.tree, event.pid),
            EventKind::ForkKilled
            | EventKind::ForkFailed
            | EventKind::Exec
            | EventKind::Diagnostic
            | EventKind::HostDying => {}
        }
    }

    /// The pids the index holds for `tree` (none for a tree it does not know).
    pub(super) fn pids(&self, tree: TreeId) -> Vec<Pid> {
        self.trees
            .get(&tree)
            .map(|set| set.pids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// How many pids the index holds for `tree`.
    pub(super) fn len(&self, tree: TreeId) -> usize {
        self.trees.get(&tree).map_or(0, |set| set.pids.len())
    }

    /// Sets `tree`'s pids to `pids`, as the map was just found to hold them (the set is then
    /// as checked as it can be). The tree is known from now on.
    pub(super) fn replace(&mut self, tree: TreeId, pids: impl IntoIterator<Item = Pid>) {
        let pids: HashSet<Pid> = pids.into_iter().collect();
        let checked = pids.len();
        self.trees.insert(tree, Pids { pids, checked });
        self.overgrown.remove(&tree);
    }

    /// The trees whose sets have grown to be checked against the map, taken.
    fn take_overgrown(&mut self) -> Vec<TreeId> {
        self.overgrown.drain().collect()
    }

    /// Takes in the records (see [`MemberIndex::record`]), then checks against the map, with
    /// `lookup` (a pid's member entry), each set grown past twice its size when last checked.
    pub(super) fn take_records(
        &mut self,
        events: &[TreeEvent],
        lookup: impl Fn(Pid) -> Option<Member>,
    ) {
        for event in events {
            self.record(event);
        }
        for tree in self.take_overgrown() {
            let before = self.len(tree);
            let kept: Vec<Pid> = self
                .pids(tree)
                .into_iter()
                .filter(|&pid| lookup(pid).is_some_and(|m| m.tree == tree))
                .collect();
            tracing::debug!(
                tree,
                before,
                after = kept.len(),
                "index checked against the map"
            );
            self.replace(tree, kept);
        }
    }

    /// `tree`'s members as the index has them, each looked up with `lookup` now: only those
    /// whose entry is in `tree`, with that entry. A pid found outside it leaves the index.
    pub(super) fn members_of(
        &mut self,
        tree: TreeId,
        lookup: impl Fn(Pid) -> Option<Member>,
    ) -> Vec<(Pid, Member)> {
        let mut found = Vec::with_capacity(self.len(tree));
        for pid in self.pids(tree) {
            match lookup(pid) {
                Some(member) if member.tree == tree => found.push((pid, member)),
                _ => self.remove(tree, pid),
            }
        }
        found
    }

    fn note_growth(&mut self, tree: TreeId) {
        if let Some(set) = self.trees.get(&tree)
            && set.pids.len() > CHECK_ABOVE.max(set.checked.saturating_mul(2))
        {
            self.overgrown.insert(tree);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, tree: TreeId, pid: Pid) -> TreeEvent {
        TreeEvent {
            kind,
            tree,
            pid,
            parent: 1,
            time_ns: 0,
            comm: String::new(),
        }
    }

    #[test]
    fn forks_join_known_trees_only_and_exits_leave() {
        let mut index = MemberIndex::default();
        index.record(&event(EventKind::Fork, 1, 100));
        assert_eq!(
            index.len(1),
            0,
            "a tree nobody put a member in is not known"
        );
        index.admit(1, 10);
        index.record(&event(EventKind::Fork, 1, 100));
        index.record(&event(EventKind::Fork, 1, 101));
        index.record(&event(EventKind::ForkFailed, 1, 102));
        index.record(&event(EventKind::Exit, 1, 100));
        let mut pids = index.pids(1);
        pids.sort_unstable();
        assert_eq!(pids, [10, 101]);
        index.record(&event(EventKind::RootExit, 1, 10));
        assert_eq!(index.pids(1), [101]);
    }

    #[test]
    fn a_released_tree_is_forgotten_and_its_late_records_ignored() {
        let mut index = MemberIndex::default();
        index.admit(1, 10);
        index.forget(1);
        index.record(&event(EventKind::Fork, 1, 100));
        assert_eq!(index.len(1), 0);
        assert!(index.trees.is_empty(), "nothing kept of it");
    }

    #[test]
    fn a_set_grown_past_twice_its_checked_size_is_to_be_checked() {
        let mut index = MemberIndex::default();
        index.replace(1, 0..100);
        for pid in 100..200 {
            index.record(&event(EventKind::Fork, 1, pid));
        }
        assert!(index.take_overgrown().is_empty(), "twice, not more");
        index.record(&event(EventKind::Fork, 1, 200));
        assert_eq!(index.take_overgrown(), [1]);
        index.replace(1, 150..201);
        assert!(index.take_overgrown().is_empty(), "checked, and 51 left");
        for pid in 300..351 {
            index.record(&event(EventKind::Fork, 1, pid));
        }
        assert!(index.take_overgrown().is_empty(), "102 is twice 51");
        index.record(&event(EventKind::Fork, 1, 351));
        assert_eq!(index.take_overgrown(), [1]);
    }

    fn member(tree: TreeId) -> Member {
        Member {
            tree,
            parent: 1,
            start_ns: 7,
        }
    }

    #[test]
    fn members_are_looked_up_and_pids_found_elsewhere_leave() {
        let mut index = MemberIndex::default();
        for pid in [10, 11, 12] {
            index.admit(1, pid);
        }
        // 10 is still a member; 11 exited (its record lost); 12's pid went to another tree.
        let lookup = |pid| match pid {
            10 => Some(member(1)),
            12 => Some(member(2)),
            _ => None,
        };
        assert_eq!(index.members_of(1, lookup), [(10, member(1))]);
        assert_eq!(index.pids(1), [10]);
    }

    #[test]
    fn an_overgrown_set_loses_what_the_map_no_longer_holds() {
        let mut index = MemberIndex::default();
        index.replace(1, 0..100);
        let forks: Vec<TreeEvent> = (100..201)
            .map(|pid| event(EventKind::Fork, 1, pid))
            .collect();
        // Exit records were dropped: only the last 50 forks are members still.
        index.take_records(&forks, |pid| (pid > 150).then(|| member(1)));
        let mut pids = index.pids(1);
        pids.sort_unstable();
        assert_eq!(pids, (151..201).collect::<Vec<_>>());
    }

    #[test]
    fn a_small_set_is_never_checked() {
        let mut index = MemberIndex::default();
        for pid in 0..CHECK_ABOVE as Pid {
            index.admit(1, pid);
        }
        assert!(index.take_overgrown().is_empty());
        index.admit(1, 1000);
        assert_eq!(index.take_overgrown(), [1]);
    }
}
