//! `list` and `status`: what a client may see of the trees and the daemon, read under one short
//! lock of the registry and from the maps, bounded whatever the trees' sizes.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use leash_client::protocol::{
    ErrorCode, LeaseId, LeaseSummary, Listing, MAX_LISTED, MAX_LISTED_PER_TREE, PROTOCOL_VERSION,
    Reply, StatusInfo, TreeId, TreeInfo,
};
use leash_common::{Member, Pid};

use super::process_figures;
use crate::{
    daemon::{
        rules::{
            auth::{may_manage, may_see},
            peer::Peer,
            pid_numbering::PidNumbering,
            refusal::Refusal,
        },
        state::{registry::TreeEntry, shared::Daemon},
    },
    kernel::Pins,
    proc,
};

/// The trees the client may see, with their members (and, `with_leases`, the leases that hold
/// or held them). The member map is read once, and /proc once per listed member, by a blocking
/// thread and under no lock; the reply is bounded (see `MAX_LISTED`) whatever the trees' sizes.
pub(in crate::daemon) async fn list(
    daemon: &Arc<Daemon>,
    peer: &Peer,
    only: Option<TreeId>,
    with_leases: bool,
) -> Result<Reply, Refusal> {
    let confined = peer.confinement(&daemon.view);
    let who = peer.requester(&confined);
    let mut trees = daemon.registry.map_trees(only, |tree, entry, host_pid| {
        let chain = daemon.view.enclosing(tree);
        may_see(who, entry.ownership().facts(&chain)).then(|| {
            let mut info = tree_info(tree, entry, chain.get(1).copied(), peer.numbering);
            info.host_pid = host_pid;
            info
        })
    });
    trees.sort_by_key(|t| t.tree);
    let mut leases = if with_leases {
        visible_leases(daemon, peer, &trees, only.is_some(), confined.is_empty())
    } else {
        Vec::new()
    };
    let reply = move |trees, leases| {
        if with_leases {
            Reply::Listing(Listing { trees, leases })
        } else {
            Reply::Trees(trees)
        }
    };
    if trees.is_empty() && leases.is_empty() {
        return Ok(reply(trees, leases));
    }
    let _turn = daemon.limits.heavy(peer.account).await;
    let (daemon, numbering) = (daemon.clone(), peer.numbering);
    tokio::task::spawn_blocking(move || {
        if !trees.is_empty() {
            let entries = daemon.view.member_entries()?;
            fill_members(&mut trees, entries, numbering);
        }
        for lease in &mut leases {
            lease.host_comm = proc::process(lease.host_pid).map(|p| p.comm);
            lease.host_pid = numbering.number(lease.host_pid);
        }
        Ok(reply(trees, leases))
    })
    .await
    .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?
    .map_err(|e: anyhow::Error| Refusal::new(ErrorCode::Internal, format!("{e:#}")))
}

/// The leases `list` shows with the trees (their hosts' pids still the daemon's, and their
/// `host_comm` not read yet): those holding a listed tree; and, to a client in no tree that
/// lists them all, every lease of its uid (all for root) that has held a tree, opened from its
/// pid namespace or one nested in it, the trees it holds now or not.
fn visible_leases(
    daemon: &Daemon,
    peer: &Peer,
    trees: &[TreeInfo],
    one_tree: bool,
    unconfined: bool,
) -> Vec<LeaseSummary> {
    let holding: HashSet<LeaseId> = trees.iter().map(|t| t.lease).collect();
    let mut leases: Vec<LeaseSummary> = daemon
        .registry
        .held_leases(|lease, uid, pid_namespaces| {
            holding.contains(&lease)
                || (!one_tree
                    && unconfined
                    && may_manage(peer.uid, uid)
                    && pid_namespaces.contains(&peer.pid_namespace))
        })
        .into_iter()
        .map(|held| LeaseSummary {
            lease: held.lease,
            owner_uid: held.uid,
            host_pid: held.host_pid,
            host_comm: None,
            trees: held.trees,
        })
        .collect();
    leases.sort_by_key(|l| l.lease);
    leases
}

/// The daemon's state as the client may see it: every tree counts, the leases it may manage.
pub(in crate::daemon) fn status(daemon: &Daemon, peer: &Peer) -> Result<Reply, Refusal> {
    let trees = daemon.registry.trees();
    let leases = daemon.registry.count_leases(|uid, pid_namespaces| {
        may_manage(peer.uid, uid) && pid_namespaces.contains(&peer.pid_namespace)
    });
    let view = &daemon.view;
    let stats = view
        .stats()
        .map_err(|e| Refusal::new(ErrorCode::Internal, format!("{e:#}")))?;
    let members = view.members_of(&trees);
    let capacity = view.capacity();
    Ok(Reply::Status(StatusInfo {
        daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
        protocol: PROTOCOL_VERSION,
        programs: daemon.programs.iter().map(|p| p.describe()).collect(),
        member_capacity: capacity.members,
        members,
        tree_capacity: capacity.trees,
        trees: trees.len() as u64,
        leases: leases.all as u64,
        host_leases: leases.hosts as u64,
        events_dropped: stats.events_dropped,
        inserts_failed: stats.inserts_failed,
        membership: Some(daemon.membership.as_str().to_owned()),
        pinned_at: daemon
            .pinned_at
            .as_ref()
            .map(|dir| dir.display().to_string()),
        pins_missing: daemon
            .pinned_at
            .as_deref()
            .map(|dir| Pins::in_dir(dir).missing())
            .unwrap_or_default()
            .iter()
            .map(|path| path.display().to_string())
            .collect(),
    }))
}

/// A tree as `list` shows it, its host and members not filled in yet.
fn tree_info(
    tree: TreeId,
    entry: &TreeEntry,
    nested_in: Option<TreeId>,
    numbering: PidNumbering,
) -> TreeInfo {
    TreeInfo {
        tree,
        lease: entry.lease,
        owner_uid: entry.owner_uid,
        root: numbering.pick(&entry.root),
        on_root_exit: entry.on_root_exit,
        grace_ms: u64::try_from(entry.grace.as_millis()).unwrap_or(u64::MAX),
        host_pid: 0,
        host_comm: None,
        root_exited: entry.root_exited,
        state: entry.state(),
        nested_in,
        member_count: 0,
        members_truncated: false,
        cpu_ms: None,
        rss_bytes: None,
        members: Vec::new(),
    }
}

/// Fills each tree's members from one read of the member map, the oldest first, at most
/// `MAX_LISTED_PER_TREE` each and `MAX_LISTED` in all, with what each runs and uses now from
/// /proc, and the tree's sums of those; and gives every pid (host, members, their parents) as
/// `numbering` gives it.
fn fill_members(trees: &mut [TreeInfo], entries: Vec<(Pid, Member)>, numbering: PidNumbering) {
    let mut by_tree: HashMap<TreeId, Vec<(Pid, Member)>> = HashMap::new();
    for (pid, member) in entries {
        by_tree.entry(member.tree).or_default().push((pid, member));
    }
    let mut room = MAX_LISTED;
    for info in trees {
        info.host_comm = proc::process(info.host_pid).map(|p| p.comm);
        info.host_pid = numbering.number(info.host_pid);
        let mut members = by_tree.remove(&info.tree).unwrap_or_default();
        info.member_count = members.len() as u64;
        members.sort_by_key(|(_, m)| m.start_ns);
        let listed = members.len().min(MAX_LISTED_PER_TREE).min(room);
        room -= listed;
        info.members_truncated = listed < members.len();
        info.members = members[..listed]
            .iter()
            .map(|(pid, m)| process_figures::of_member(*pid, m, numbering))
            .collect();
        process_figures::add_up(info);
    }
}
