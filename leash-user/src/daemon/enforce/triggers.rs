//! When trees are killed: a root exits, a lease ends (its host dies, or its connection
//! closes), or a tree cannot be tracked.
//!
//! A host's death is seen three ways, the first to come ending its leases: the programs report
//! it as it begins (a fatal signal, a crash: `host_killed`), its socket closes, and its pidfd
//! turns readable (`host_exited`). The last two come only once the kernel has torn the host's
//! memory down.
//!
//! Root exits are seen two ways: the ring buffer's events wake the daemon at once, and a sweep
//! of the kernel's per-tree state catches anything the events missed (they are best effort;
//! the maps are the truth).

use std::{os::fd::OwnedFd, rc::Rc, time::Duration};

use leash_client::protocol::{KillReason, LeaseId, RootExitPolicy, TreeId};
use tokio::sync::oneshot;

use super::{
    enforcement::{end_tree, start_kill},
    tree_events::{self, HostDying},
};
use crate::{
    daemon::{rules::lease_end::LeaseEnd, state::owner::Owner},
    kernel::TreeStatus,
    sys,
};

/// How often the per-tree state in the kernel is checked, whatever the events said.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Every how many sweeps each live tree's root is checked for an exit the programs did not see
/// (a pidfd opened per tree: about a second apart).
const ROOT_CHECK_EVERY_SWEEPS: u32 = 10;
/// How often the ring buffer is read when nothing wakes the daemon: the programs wake it only
/// for a root's exit, and leave fork, exec and exit records to be collected.
const COLLECT_EVERY: Duration = Duration::from_millis(50);

/// Reacts to the ring buffer's root-exit events as soon as they are written, and collects the
/// other records every 50 ms.
pub(in crate::daemon) async fn watch_events(owner: Rc<Owner>) {
    let readable = owner.tracker().events_fd().and_then(sys::async_readable);
    let readable = match readable {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!("cannot watch the event ring buffer ({e}); relying on the sweep");
            return;
        }
    };
    let mut collect = tokio::time::interval(COLLECT_EVERY);
    loop {
        tokio::select! {
            ready = readable.readable() => match ready {
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => return,
            },
            _ = collect.tick() => {}
        }
        take_kernel_news(&owner);
    }
}

/// Acts on what the programs have reported and the owner has not read yet: hosts dying, roots
/// exited.
fn take_kernel_news(owner: &Rc<Owner>) {
    let collected = tree_events::collect(owner);
    for dying in &collected.hosts_dying {
        host_dying(owner, dying);
    }
    for tree in collected.root_exits {
        root_exited(owner, tree);
    }
}

/// The backstop: reads every live tree's state in the kernel.
pub(in crate::daemon) async fn sweep(owner: Rc<Owner>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    for sweep in 0_u32.. {
        every.tick().await;
        let check_roots = sweep.is_multiple_of(ROOT_CHECK_EVERY_SWEEPS);
        if check_roots && let Err(e) = owner.tracker().reconcile_after_skips() {
            tracing::warn!("{}", e.with_causes());
        }
        for tree in owner.daemon.registry.live_trees() {
            let Ok(status) = owner.tracker().tree_status(tree) else {
                continue;
            };
            if let Some(reason) = fail_closed(&status) {
                tracing::error!(
                    tree,
                    reason = reason.as_str(),
                    over_quota = status.over_quota,
                    failed = status.failed_inserts,
                    "tree cannot be tracked"
                );
                start_kill(&owner, tree, None, reason);
                continue;
            }
            if status.root_exit_ns.is_some() || check_roots && root_exited_unseen(&owner, &status) {
                root_exited(&owner, tree);
                finish_if_kept_and_empty(&owner, tree);
            }
        }
    }
}

/// Whether the tree's root has exited without the programs seeing it (7.x can skip them: see
/// `program::FORK_AGAIN`); said in the log, and its entry is taken out.
fn root_exited_unseen(owner: &Rc<Owner>, status: &TreeStatus) -> bool {
    let unseen = owner
        .tracker()
        .root_exited_unseen(status.tree, status.root)
        .unwrap_or(false);
    if unseen {
        tracing::warn!(
            tree = status.tree,
            root = status.root,
            "the root exited and the kernel did not run the exit programs for it: its exit is \
             taken from its pidfd"
        );
    }
    unseen
}

/// Records a root's exit once and applies the tree's policy.
pub(in crate::daemon) fn root_exited(owner: &Rc<Owner>, tree: TreeId) {
    if let Some(policy) = tree_events::announce_root_exit(&owner.daemon, tree) {
        apply_root_exit(owner, tree, policy);
    }
}

/// Applies `tree`'s `policy` for its root's exit, which was told already.
pub(in crate::daemon) fn apply_root_exit(owner: &Rc<Owner>, tree: TreeId, policy: RootExitPolicy) {
    // A root killed as it forked past what may be tracked: say why the tree dies.
    let status = owner.tracker().tree_status(tree);
    let untrackable = status.ok().and_then(|status| fail_closed(&status));
    if let Some(reason) = untrackable {
        start_kill(owner, tree, None, reason);
    } else if policy == RootExitPolicy::Kill {
        start_kill(owner, tree, None, KillReason::RootExited);
    }
}

/// Why a tree must be killed however its policy reads (fail closed), if it must: it forked
/// past its owner's member quota, or a child could not be tracked because the member map was
/// full.
fn fail_closed(status: &TreeStatus) -> Option<KillReason> {
    if status.over_quota > 0 {
        Some(KillReason::MemberQuota)
    } else if status.failed_inserts > 0 {
        Some(KillReason::Untrackable)
    } else {
        None
    }
}

/// A tree whose members were kept after its root exited ends when it has emptied on its own.
fn finish_if_kept_and_empty(owner: &Rc<Owner>, tree: TreeId) {
    let empty = owner.tracker().is_empty(tree).unwrap_or(false);
    if empty && owner.daemon.registry.is_kept(tree) {
        tracing::info!(tree, "tree is empty");
        end_tree(owner, tree, None);
    }
}

/// A lease ended (its host died or its connection closed), for `reason` (`host_exited`,
/// `connection_closed`, ...): every tree it holds is killed.
pub(in crate::daemon) fn end_lease(owner: &Rc<Owner>, lease: LeaseId, reason: LeaseEnd) {
    // A host's exit is seen by its socket and its pidfd as well as by the programs, which saw
    // it first if it was killed: what they reported is taken first, so that its lease ends
    // for the reason the kernel gave (a second end of a lease does nothing).
    if reason != LeaseEnd::HostKilled {
        take_kernel_news(owner);
    }
    let registry = &owner.daemon.registry;
    let host = registry.host_of(lease);
    for tree in registry.end_lease(lease, reason) {
        start_kill(owner, tree, None, KillReason::LeaseEnded);
    }
    // The host's death is no longer news once no lease of it holds a tree.
    if let Some(host) = host.filter(|&host| !registry.host_holds_trees(host)) {
        owner.tracker().unwatch_host_death(host);
    }
}

/// Has the programs report the death of the host of `lease`, which now holds a tree, as it
/// begins. Best effort: the host's pidfd and socket stay the backstop.
pub(in crate::daemon) fn watch_host_death(owner: &Owner, lease: LeaseId) {
    let Some(host) = owner.daemon.registry.host_of(lease) else {
        return;
    };
    if let Err(e) = owner.tracker().watch_host_death(host) {
        tracing::debug!(
            lease,
            host = host.pid,
            "the kernel does not watch the host's death ({e}): its exit ends the lease"
        );
    }
}

/// The kernel saw `host` start to die (a signal set it exiting, or it crashed): its leases end
/// now, before its exit has torn down its memory.
pub(in crate::daemon) fn host_dying(owner: &Rc<Owner>, dying: &HostDying) {
    for lease in tree_events::leases_of_dying_host(&owner.daemon, dying) {
        end_lease(owner, lease, LeaseEnd::HostKilled);
    }
}

/// Ends `lease` when its host process (`pidfd`) exits; stops watching, without ending it, when
/// `until` closes (the connection that holds the lease ended, and ends it itself).
pub(in crate::daemon) fn watch_host(
    owner: &Rc<Owner>,
    lease: LeaseId,
    pidfd: OwnedFd,
    until: Option<oneshot::Receiver<()>>,
) {
    let host = match sys::async_readable(pidfd) {
        Ok(host) => host,
        Err(e) => {
            tracing::error!(lease, "cannot watch the host: {e}; ending its lease");
            return end_lease(owner, lease, LeaseEnd::HostUnwatchable);
        }
    };
    let owner = owner.clone();
    tokio::task::spawn_local(async move {
        let served = async {
            match until {
                Some(until) => {
                    let _ = until.await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = host.readable() => end_lease(&owner, lease, LeaseEnd::HostExited),
            () = served => {}
        }
    });
}
