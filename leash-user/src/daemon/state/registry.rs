//! What the daemon knows of leases and trees beyond the kernel maps, behind methods that keep
//! its rules: a tree is filed only within its accounts' quotas, checked and counted under one
//! lock; a tree's kill is begun once, and every later kill waits on it; a lease is ended once.
//! Every lock is short and bounded, and never held across an await.

use std::{
    collections::HashMap,
    io,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use leash_client::protocol::{KillReason, LeaseId, RootExitPolicy, TreeId, TreeState};
use leash_common::{Account, Holder};
use tokio::sync::watch;

use super::subscribers::Audience;
use crate::{daemon::rules::lease_end::LeaseEnd, proc::ProcessRef};

mod entry;
mod lease;

use entry::PendingKill;
pub(in crate::daemon) use entry::{
    BegunKill, KillOutcome, KillStart, LeaseHolder, NoLease, OverQuota, Ownership, PendingOutcome,
    RootExit, TreeEntry,
};
pub(in crate::daemon) use lease::{HeldLease, LeaseCounts};
use lease::{Lease, new_token};

#[derive(Debug)]
struct State {
    trees: HashMap<TreeId, TreeEntry>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: LeaseId,
    /// Registrations under way, per account they count against: filed or not, they count.
    reserved: HashMap<Account, usize>,
}

/// The daemon's leases and trees. Clones share them.
#[derive(Clone, Debug)]
pub(in crate::daemon) struct Registry(Arc<Mutex<State>>);

/// A registration's place in its accounts' quotas, held from before its /proc walk until its
/// tree is filed; dropped unfiled, the place is given back.
#[must_use = "a reservation is filed, or dropped to give its place back"]
pub(in crate::daemon) struct Reservation {
    registry: Registry,
    accounts: Vec<Account>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut state = self.registry.state();
        for account in &self.accounts {
            if let Some(count) = state.reserved.get_mut(account) {
                *count -= 1;
                if *count == 0 {
                    state.reserved.remove(account);
                }
            }
        }
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(State {
            trees: HashMap::new(),
            leases: HashMap::new(),
            next_lease: 1,
            reserved: HashMap::new(),
        })))
    }
}

impl Registry {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the plain data it guards is still
        // consistent (every update is one map operation), so go on with it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a lease for the process `host` of uid `uid`, charged to `account`, running in
    /// `pid_namespaces` (its own first), with a new secret token.
    pub(in crate::daemon) fn open_lease(
        &self,
        uid: u32,
        account: Account,
        pid_namespaces: Arc<[u32]>,
        host: ProcessRef,
    ) -> io::Result<LeaseId> {
        let token = new_token()?;
        let mut state = self.state();
        let id = state.next_lease;
        state.next_lease += 1;
        state.leases.insert(
            id,
            Lease {
                token,
                uid,
                account,
                pid_namespaces,
                host,
                held_trees: false,
            },
        );
        Ok(id)
    }

    /// Notes that `lease` now holds a tree; at its first, says so at INFO (`lease_opened`). A
    /// connection that only asks (`status`, `list`, `watch`) is logged at DEBUG alone: a client
    /// that connects in a loop must not fill the log.
    pub(in crate::daemon) fn lease_holds_a_tree(&self, lease: LeaseId) {
        let first = {
            let mut state = self.state();
            let Some(entry) = state.leases.get_mut(&lease) else {
                return;
            };
            let first = !entry.held_trees;
            entry.held_trees = true;
            first.then_some((entry.uid, entry.host.pid))
        };
        if let Some((uid, host_pid)) = first {
            // No span: the events an operator queries carry their own fields, and only those.
            tracing::info!(
                parent: None,
                event = "lease_opened",
                lease,
                host_pid,
                uid,
                "lease opened"
            );
        }
    }

    /// Ends `lease` for `reason` and returns its trees (the caller's to kill). Logs its end: at
    /// INFO (`lease_ended`) if it ever held a tree, at DEBUG if it only asked. Once: when both
    /// the connection and the watch on its host see the host die, the second finds it gone
    /// (and its trees already being killed).
    pub(in crate::daemon) fn end_lease(&self, lease: LeaseId, reason: LeaseEnd) -> Vec<TreeId> {
        let (entry, trees) = {
            let mut state = self.state();
            let Some(entry) = state.leases.remove(&lease) else {
                return Vec::new();
            };
            let trees = state
                .trees
                .iter()
                .filter(|(_, tree)| tree.lease == lease)
                .map(|(&id, _)| id)
                .collect();
            (entry, trees)
        };
        if entry.held_trees {
            tracing::info!(
                parent: None,
                event = "lease_ended",
                lease,
                host_pid = entry.host.pid,
                uid = entry.uid,
                reason = reason.as_str(),
                "lease ended"
            );
        } else {
            tracing::debug!(lease, reason = reason.as_str(), "lease ended");
        }
        trees
    }

    /// The host of `lease`, if it is live.
    pub(in crate::daemon) fn host_of(&self, lease: LeaseId) -> Option<ProcessRef> {
        self.state().leases.get(&lease).map(|lease| lease.host)
    }

    /// The live leases whose host is `host`.
    pub(in crate::daemon) fn leases_of(&self, host: ProcessRef) -> Vec<LeaseId> {
        let state = self.state();
        let leases = state.leases.iter();
        leases
            .filter(|(_, lease)| lease.host == host)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether a tree is held under a live lease of `host`.
    pub(in crate::daemon) fn host_holds_trees(&self, host: ProcessRef) -> bool {
        let state = self.state();
        state.trees.values().any(|tree| {
            state
                .leases
                .get(&tree.lease)
                .is_some_and(|lease| lease.host == host)
        })
    }

    /// The secret of `lease`, if it is live.
    pub(in crate::daemon) fn token(&self, lease: LeaseId) -> Option<String> {
        self.state().leases.get(&lease).map(|l| l.token.clone())
    }

    /// The lease a new tree goes under: `own` (the connection's), or the one `token` names.
    pub(in crate::daemon) fn lease_for(
        &self,
        own: LeaseId,
        token: Option<&str>,
    ) -> Result<LeaseHolder, NoLease> {
        let state = self.state();
        let (lease, found) = match token {
            None => state
                .leases
                .get(&own)
                .map(|found| (own, found))
                .ok_or(NoLease::Own)?,
            Some(token) => state
                .leases
                .iter()
                .find(|(_, lease)| lease.token == token)
                .map(|(&id, found)| (id, found))
                .ok_or(NoLease::Token)?,
        };
        Ok(LeaseHolder {
            lease,
            holder: Holder {
                host_pid: found.host.pid,
                owner_uid: found.uid,
                host_start_ticks: found.host.start_ticks,
                account: found.account,
                ..Holder::default()
            },
            pid_namespaces: found.pid_namespaces.clone(),
        })
    }

    /// How many leases `may_see` lets through, given each lease's uid and pid namespaces:
    /// all of them, and hosts' (those that registered a tree).
    pub(in crate::daemon) fn count_leases(
        &self,
        mut may_see: impl FnMut(u32, &[u32]) -> bool,
    ) -> LeaseCounts {
        let state = self.state();
        let mut counts = LeaseCounts::default();
        for lease in state.leases.values() {
            if may_see(lease.uid, &lease.pid_namespaces) {
                counts.all += 1;
                counts.hosts += usize::from(lease.held_trees);
            }
        }
        counts
    }

    /// Every lease that holds a tree or has held one, with its host and how many trees it holds
    /// now, that `may_see` lets through given its uid and pid namespaces: a read model for
    /// `list`, made under one short lock. A connection that only asks is not among them.
    pub(in crate::daemon) fn held_leases(
        &self,
        mut may_see: impl FnMut(LeaseId, u32, &[u32]) -> bool,
    ) -> Vec<HeldLease> {
        let state = self.state();
        let mut trees: HashMap<LeaseId, u64> = HashMap::new();
        for entry in state.trees.values() {
            *trees.entry(entry.lease).or_default() += 1;
        }
        state
            .leases
            .iter()
            .filter(|(id, lease)| {
                lease.held_trees && may_see(**id, lease.uid, &lease.pid_namespaces)
            })
            .map(|(&id, lease)| HeldLease {
                lease: id,
                uid: lease.uid,
                host_pid: lease.host.pid,
                trees: trees.get(&id).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Every live lease.
    pub(in crate::daemon) fn lease_count(&self) -> usize {
        self.state().leases.len()
    }

    /// Takes a place for a new tree in the quota of each of `accounts` (root's, 0, has none):
    /// each may hold at most `limit` trees, those being registered included. Checked and taken
    /// under one lock, so that registrations running side by side cannot both pass the check.
    pub(in crate::daemon) fn reserve(
        &self,
        accounts: &[Account],
        limit: usize,
    ) -> Result<Reservation, OverQuota> {
        let mut accounts: Vec<Account> = accounts.iter().copied().filter(|&a| a != 0).collect();
        accounts.dedup();
        let mut state = self.state();
        for &account in &accounts {
            let held = state
                .trees
                .values()
                .filter(|tree| tree.charged_to(account))
                .count()
                + state.reserved.get(&account).copied().unwrap_or(0);
            if held >= limit {
                return Err(OverQuota { account, held });
            }
        }
        for &account in &accounts {
            *state.reserved.entry(account).or_default() += 1;
        }
        Ok(Reservation {
            registry: self.clone(),
            accounts,
        })
    }

    /// Files a tree just registered, in the place `reservation` holds. Returns why it must be
    /// killed at once, if it must: its lease ended meanwhile (`lease_ended`), or the tree it is
    /// nested in (`enclosing`) is being killed or gone (`enclosing_killed`).
    pub(in crate::daemon) fn file(
        &self,
        tree: TreeId,
        entry: TreeEntry,
        enclosing: Option<TreeId>,
        reservation: Reservation,
    ) -> Option<KillReason> {
        let mut state = self.state();
        let lease_ended = !state.leases.contains_key(&entry.lease);
        let enclosing_ended = enclosing.is_some_and(|outer| {
            state
                .trees
                .get(&outer)
                .is_none_or(|outer| outer.kill.is_some())
        });
        state.trees.insert(tree, entry);
        // Filed: the tree counts now, and the reservation no longer.
        drop(state);
        drop(reservation);
        if lease_ended {
            Some(KillReason::LeaseEnded)
        } else if enclosing_ended {
            Some(KillReason::EnclosingKilled)
        } else {
            None
        }
    }

    /// Files a tree a previous daemon left in the pins (no quota: it is held already).
    pub(in crate::daemon) fn hold(&self, tree: TreeId, entry: TreeEntry) {
        self.state().trees.insert(tree, entry);
    }

    /// How many trees are filed.
    pub(in crate::daemon) fn tree_count(&self) -> usize {
        self.state().trees.len()
    }

    /// Every filed tree.
    pub(in crate::daemon) fn trees(&self) -> Vec<TreeId> {
        self.state().trees.keys().copied().collect()
    }

    /// Every tree no kill is under way for.
    pub(in crate::daemon) fn live_trees(&self) -> Vec<TreeId> {
        let state = self.state();
        state
            .trees
            .iter()
            .filter(|(_, entry)| entry.kill.is_none())
            .map(|(&tree, _)| tree)
            .collect()
    }

    /// Who holds `tree`.
    pub(in crate::daemon) fn ownership(&self, tree: TreeId) -> Option<Ownership> {
        self.state().trees.get(&tree).map(TreeEntry::ownership)
    }

    /// Who hears of `tree`'s events, and its lease.
    pub(in crate::daemon) fn audience(&self, tree: TreeId) -> Option<(Audience, LeaseId)> {
        self.state()
            .trees
            .get(&tree)
            .map(|entry| (entry.audience(), entry.lease))
    }

    /// Records that `tree`'s root exited; None if it is not filed or was recorded before.
    pub(in crate::daemon) fn root_exited(&self, tree: TreeId) -> Option<RootExit> {
        let mut state = self.state();
        let entry = state.trees.get_mut(&tree)?;
        if entry.root_exited {
            return None;
        }
        entry.root_exited = true;
        Some(RootExit {
            audience: entry.audience(),
            lease: entry.lease,
            root: entry.root.clone(),
            policy: entry.on_root_exit,
        })
    }

    /// Whether `tree` keeps its members past its root's exit, and no kill is under way.
    pub(in crate::daemon) fn is_kept(&self, tree: TreeId) -> bool {
        self.state()
            .trees
            .get(&tree)
            .is_some_and(|entry| entry.on_root_exit == RootExitPolicy::Keep && entry.kill.is_none())
    }

    /// Begins `tree`'s kill, unless one is under way; None if there is no such tree. The grace
    /// period is the tree's own, or `grace` if that is shorter. A kill under way keeps going,
    /// with its grace shortened to that if it is shorter.
    pub(in crate::daemon) fn begin_kill(
        &self,
        tree: TreeId,
        grace: Option<Duration>,
    ) -> Option<KillStart> {
        let mut state = self.state();
        let entry = state.trees.get_mut(&tree)?;
        let grace = grace.map_or(entry.grace, |asked| asked.min(entry.grace));
        if let Some(pending) = &entry.kill {
            pending.grace.send_if_modified(|now| {
                let shorter = grace < *now;
                *now = (*now).min(grace);
                shorter
            });
            return Some(KillStart::UnderWay(pending.outcome.clone()));
        }
        let (done, outcome) = watch::channel(None);
        let (grace_sender, grace_asked) = watch::channel(grace);
        entry.kill = Some(PendingKill {
            outcome: outcome.clone(),
            grace: grace_sender,
        });
        entry.unkillable = false;
        Some(KillStart::Begun(BegunKill {
            audience: entry.audience(),
            lease: entry.lease,
            host_pid: entry.host_pid,
            owner_uid: entry.owner_uid,
            grace,
            done,
            outcome,
            grace_asked,
        }))
    }

    /// A kill of `tree` gave up: it stays, unkillable, and another kill may try again. Returns
    /// who hears of it, and its lease.
    pub(in crate::daemon) fn kill_failed(&self, tree: TreeId) -> Option<(Audience, LeaseId)> {
        let mut state = self.state();
        let entry = state.trees.get_mut(&tree)?;
        entry.kill = None;
        entry.unkillable = true;
        Some((entry.audience(), entry.lease))
    }

    /// Takes `tree` out: it is empty, or released.
    pub(in crate::daemon) fn remove(&self, tree: TreeId) -> Option<TreeEntry> {
        self.state().trees.remove(&tree)
    }

    /// Takes `tree` out to be released, unless it is being killed (or a kill gave up on it).
    /// Err(None): no such tree; Err(Some(state)): it is in that state.
    pub(in crate::daemon) fn take_for_release(
        &self,
        tree: TreeId,
    ) -> Result<TreeEntry, Option<TreeState>> {
        let mut state = self.state();
        match state.trees.get(&tree).map(TreeEntry::state) {
            None => Err(None),
            Some(TreeState::Live) => Ok(state.trees.remove(&tree).expect("found above")),
            Some(other) => Err(Some(other)),
        }
    }

    /// Calls `each` with every tree `only` names (every one if None), and keeps what it makes
    /// of each: a read model made under one short lock.
    pub(in crate::daemon) fn map_trees<T>(
        &self,
        only: Option<TreeId>,
        mut each: impl FnMut(TreeId, &TreeEntry, u32) -> Option<T>,
    ) -> Vec<T> {
        let state = self.state();
        state
            .trees
            .iter()
            .filter(|(tree, _)| only.is_none_or(|only| only == **tree))
            .filter_map(|(&tree, entry)| {
                // Its lease's host while the lease lasts, 0 once it has ended.
                let host_pid = state.leases.get(&entry.lease).map_or(0, |l| l.host.pid);
                each(tree, entry, host_pid)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
