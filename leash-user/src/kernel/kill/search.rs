//! Finding a kill's members, and queueing their signals.
//!
//! A search costs what the tree costs, not what the map holds: it looks up the pids the index
//! of each tree's pids has for the tree (see `kernel::index`), and trusts what it found only if
//! the kernel's counters show it found every member; otherwise it walks the whole map, which is
//! the truth. The counters can show it because a member cannot come back once it has left:
//! with none joined or put in between the two reads of the counters around the lookups, every
//! entry found in the tree was counted by the first read, so finding as many as it counted
//! finds them all.

use anyhow::Result;

use super::{
    Kill,
    signal::Signal,
    target::KillTarget,
    types::{BURST_SIGNALS, Enqueued, Found, Queued, STALE_CHECKS_PER_WALK, Search, found_all},
};
use crate::proc::ProcessRef;

impl Kill {
    /// Finds the tree's members (see [`Kill::find_members`]) and queues what `signal` says for
    /// each.
    pub(super) fn enqueue<T: KillTarget>(
        &mut self,
        tracker: &mut T,
        signal: Signal,
        search: Search,
    ) -> Result<Enqueued> {
        // The burst begins with the search: nothing else takes the CPU between the members
        // found and the signals (it ends when the queue is worked through, or found empty).
        if self.burst.is_none() && self.killed + self.terminated < BURST_SIGNALS {
            self.burst = Some(Box::new(tracker.burst()));
        }
        // Marked processes the fork programs missed join the map first, so the search finds them.
        tracker.reconcile()?;
        let Found {
            members,
            walked,
            joined,
        } = self.find_members(tracker, search)?;
        let mut queued = 0;
        let mut exit_checks = 0;
        for (pid, member) in members {
            let process = ProcessRef::of_member(pid, &member);
            let killed = self.signalled.get(&process).copied();
            // Sent SIGKILL, and still in the map once it has exited: the kernel skipped the exit
            // programs for it (see `program::FORK_AGAIN`), and only user space can take its
            // entry out. Looked for on walks, a bounded number each, so a step stays short.
            if walked && killed == Some(true) && exit_checks < STALE_CHECKS_PER_WALK {
                exit_checks += 1;
                if tracker.has_exited(process) {
                    tracker.drop_stale(pid, member)?;
                    continue;
                }
            }
            let Some(number) = signal.for_member(&member, killed) else {
                continue;
            };
            let entry = Queued {
                pid,
                member,
                signal: number,
            };
            // A member born doomed is not kept waiting behind SIGTERMs.
            if number == libc::SIGKILL {
                self.queue.push_front(entry);
            } else {
                self.queue.push_back(entry);
            }
            queued += 1;
        }
        tracing::debug!(signal = signal.as_str(), queued, walked, "queued");
        Ok(Enqueued {
            count: queued,
            walked,
            joined,
        })
    }

    /// The tree's members now: those the index has, if the counters show they are all of them
    /// (see the module doc), or else every member a walk of the whole map finds (and the index
    /// is set to them).
    fn find_members<T: KillTarget>(&self, tracker: &mut T, search: Search) -> Result<Found> {
        let before = tracker.tree_status(self.tree)?;
        if search == Search::Index {
            let members = tracker.indexed_members(self.tree);
            let after = tracker.tree_status(self.tree)?;
            if found_all(&before, &after, members.len()) {
                return Ok(Found {
                    members,
                    walked: false,
                    joined: before.joined,
                });
            }
            tracing::debug!(
                tree = self.tree,
                indexed = members.len(),
                counted = before.members,
                "the index cannot be shown to hold every member: walking the map"
            );
        }
        let members: Vec<_> = tracker
            .member_entries()?
            .into_iter()
            .filter(|(_, member)| member.tree == self.tree)
            .collect();
        tracker.reindex(self.tree, &members);
        Ok(Found {
            members,
            walked: true,
            joined: before.joined,
        })
    }
}
