//! The tracker's use of the member index (index.rs): members found through it, each checked in
//! the map, and its upkeep from the records and the kill's walks. Apart from the index itself,
//! which the view holds, so that the index needs nothing of the tracker.

use leash_common::{Member, Pid, TreeId};

use super::{record::TreeEvent, tracker::Tracker};

impl Tracker {
    /// `tree`'s members as the index has them, each looked up in the map now: only those whose
    /// entry is in `tree`, with that entry. A pid found outside it is taken out of the index.
    pub(super) fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)> {
        let mut found = Vec::with_capacity(self.view.index.len(tree));
        for pid in self.view.index.pids(tree) {
            match self.member(pid) {
                Some(member) if member.tree == tree => found.push((pid, member)),
                _ => self.view.index.remove(tree, pid),
            }
        }
        found
    }

    /// Sets `tree`'s pids in the index to those a walk of the map just found.
    pub(super) fn reindex(&mut self, tree: TreeId, members: &[(Pid, Member)]) {
        self.view
            .index
            .replace(tree, members.iter().map(|&(pid, _)| pid));
    }

    /// Takes the records' news into the index, and checks against the map the sets that have
    /// grown past twice their size when last checked (exit records may have been dropped).
    pub(super) fn index_records(&mut self, events: &[TreeEvent]) {
        for event in events {
            self.view.index.record(event);
        }
        for tree in self.view.index.take_overgrown() {
            let before = self.view.index.len(tree);
            let kept: Vec<Pid> = self
                .view
                .index
                .pids(tree)
                .into_iter()
                .filter(|&pid| self.member(pid).is_some_and(|m| m.tree == tree))
                .collect();
            tracing::debug!(
                tree,
                before,
                after = kept.len(),
                "index checked against the map"
            );
            self.view.index.replace(tree, kept);
        }
    }
}
