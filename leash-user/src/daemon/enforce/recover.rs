//! Taking over after a restart. The trees a previous daemon left in the pinned maps are held
//! again, each under a lease that lasts as long as the host process recorded with the tree:
//! the host's connection died with the old daemon, but the host may not have. Whatever happened
//! while no daemon was there is then enforced: a root that exited is seen by the sweep, a host
//! that died ends its lease at once, and a kill that was under way is finished.

use std::{
    collections::{HashMap, hash_map::Entry},
    os::fd::OwnedFd,
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use leash_client::protocol::{KillReason, LeaseId, RootExitPolicy, TreeId};
use leash_common::{Holder, Pid, holder_flags};

use super::{
    adoption::root_numbers,
    enforcement::start_kill,
    triggers::{end_lease, watch_host},
};
use crate::{
    daemon::{
        rules::lease_end::LeaseEnd,
        state::{identity::ClientIdentity, owner::Owner, registry::TreeEntry, shared::Daemon},
    },
    proc::{self, ProcessRef},
};

/// A recorded host's new lease, and its pid namespaces.
type HeldHost = (LeaseId, Arc<[u32]>);

/// Who the host recorded in `holder` is: its account as recorded, and its pid namespaces as
/// the kernel says now (the daemon's own if it is gone: its lease then ends at once).
fn host_identity(daemon: &Daemon, holder: &Holder) -> ClientIdentity {
    let found = daemon
        .whois
        .ask(holder.host_pid)
        .ok()
        .flatten()
        .filter(|_| proc::alive_start(holder.host_pid) == Some(holder.host_start_ticks));
    ClientIdentity {
        account: holder.account,
        in_user_namespace: found.as_ref().is_some_and(|found| found.user_ns.is_some()),
        pid_namespaces: found.map_or_else(
            || [daemon.pid_namespace].into(),
            |found| found.pid_namespaces.into(),
        ),
    }
}

/// Holds every tree found in the maps again: one lease per recorded host, watched until the
/// host exits. A tree with no recorded holder is killed (fail closed).
pub(in crate::daemon) fn hold_again(owner: &Rc<Owner>) {
    let daemon = &owner.daemon;
    let found: Vec<(TreeId, Holder, Pid, bool)> = {
        let tracker = owner.tracker();
        tracker
            .trees()
            .into_iter()
            .filter_map(|tree| {
                let status = tracker.tree_status(tree).ok()?;
                let holder = tracker.holder(tree).ok()?;
                Some((tree, holder, status.root, status.doomed_ns.is_some()))
            })
            .collect()
    };
    // Per recorded host: its lease, and the pid namespaces it is in.
    let mut hosts: HashMap<ProcessRef, HeldHost> = HashMap::new();
    let (mut unheld, mut doomed) = (Vec::new(), Vec::new());
    for &(tree, holder, root, is_doomed) in &found {
        let (lease, registered_from) = if holder.host_pid == 0 {
            unheld.push(tree);
            (0, [daemon.pid_namespace].into())
        } else {
            match hosts.entry(recorded_host(&holder)) {
                Entry::Occupied(known) => known.get().clone(),
                Entry::Vacant(new) => {
                    let who = host_identity(daemon, &holder);
                    let opened = daemon.registry.open_lease(
                        holder.owner_uid,
                        who.account,
                        who.pid_namespaces.clone(),
                        *new.key(),
                    );
                    match opened {
                        Ok(lease) => {
                            daemon.registry.lease_holds_a_tree(lease);
                            new.insert((lease, who.pid_namespaces)).clone()
                        }
                        Err(e) => {
                            tracing::error!(tree, "cannot open a lease for it: {e}");
                            unheld.push(tree);
                            (0, [daemon.pid_namespace].into())
                        }
                    }
                }
            }
        };
        if is_doomed {
            doomed.push(tree);
        }
        let on_root_exit = if holder.flags & holder_flags::KEEP_ON_ROOT_EXIT != 0 {
            RootExitPolicy::Keep
        } else {
            RootExitPolicy::Kill
        };
        let entry = TreeEntry::new(
            lease,
            &holder,
            holder.account,
            registered_from,
            root_numbers(root),
            on_root_exit,
            Duration::from_millis(holder.grace_ms.into()),
        );
        daemon.registry.hold(tree, entry);
    }
    tracing::info!(
        trees = found.len(),
        hosts = hosts.len(),
        "holding the trees of the previous daemon"
    );
    for tree in unheld {
        tracing::warn!(tree, "no holder recorded for the tree: killing it");
        start_kill(owner, tree, None, KillReason::LeaseEnded);
    }
    for tree in doomed {
        start_kill(owner, tree, None, KillReason::Resumed);
    }
    watch_host_deaths_again(owner, &hosts);
    for (host, (lease, _)) in hosts {
        watch_host_again(owner, lease, host);
    }
}

/// The host `holder` records.
fn recorded_host(holder: &Holder) -> ProcessRef {
    ProcessRef {
        pid: holder.host_pid,
        start_ticks: holder.host_start_ticks,
    }
}

/// Has the programs watch the death of every host held again, and of no other: the pinned map
/// kept the previous daemon's, and a lease that ended while no daemon ran left its host there.
fn watch_host_deaths_again(owner: &Owner, held: &HashMap<ProcessRef, HeldHost>) {
    let mut tracker = owner.tracker();
    for host in tracker.watched_hosts() {
        if !held.contains_key(&host) {
            tracker.unwatch_host_death(host);
        }
    }
    for &host in held.keys() {
        if let Err(e) = tracker.watch_host_death(host) {
            tracing::debug!(
                host = host.pid,
                "the kernel does not watch the host's death ({e})"
            );
        }
    }
}

/// How often a host that could not be opened (out of file descriptors, say) is tried again.
const HOST_RETRY: Duration = Duration::from_secs(1);

/// Ends `lease` when its host exits (at once if it already has). A host that cannot be
/// opened is not taken for gone: its trees stay held, tracked by the programs, and it is tried
/// again until it is watched or found gone.
fn watch_host_again(owner: &Rc<Owner>, lease: LeaseId, host: ProcessRef) {
    let owner = owner.clone();
    let pid = host.pid;
    tokio::task::spawn_local(async move {
        let mut failed = false;
        loop {
            match host_pidfd(host) {
                Ok(Some(pidfd)) => {
                    tracing::info!(lease, host = pid, "watching the host again");
                    return watch_host(&owner, lease, pidfd, None);
                }
                Ok(None) => {
                    return end_lease(&owner, lease, LeaseEnd::HostExitedWhileAway);
                }
                Err(e) => {
                    if !failed {
                        tracing::warn!(
                            lease,
                            host = pid,
                            "cannot watch the host ({e}); trying every {HOST_RETRY:?}"
                        );
                        failed = true;
                    }
                    tokio::time::sleep(HOST_RETRY).await;
                }
            }
        }
    });
}

/// A pidfd of `host`, if it runs still and has not exited (every thread of it: a host whose
/// main thread exited runs on); None if it is gone.
fn host_pidfd(host: ProcessRef) -> std::io::Result<Option<OwnedFd>> {
    let Some(pidfd) = host.open()? else {
        return Ok(None);
    };
    if pidfd.has_exited() {
        return Ok(None);
    }
    Ok(Some(pidfd.into()))
}
