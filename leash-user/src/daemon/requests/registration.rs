//! `register`: who may register what, under which lease, within which quotas; then the
//! adoption (see `adoption`) and the news of it.

use std::{sync::Arc, time::Duration};

use leash_client::protocol::{
    ErrorCode, Event, EventKind, MAX_GRACE_MS, Reply, RootExitPolicy, TreeId,
};
use leash_common::holder_flags;

use crate::{
    daemon::{
        enforce::adoption::{adopt, root_numbers},
        io::request_stream::Pidfds,
        rules::{
            auth::{ProcessUids, RegisterDenied, RegisterFacts, may_register},
            limits::describe,
            peer::Peer,
            refusal::Refusal,
        },
        state::{
            registry::{NoLease, OverQuota, TreeEntry},
            shared::Daemon,
            subscribers::Audience,
        },
    },
    kernel::{identify, identify_pidfd},
    sys::Pidfd,
};

/// How a `register` names its process.
pub(in crate::daemon) enum Named {
    /// A number of the daemon's pid namespace.
    Pid(u32),
    /// A pidfd sent with the request.
    Pidfd(Pidfd),
    /// The client itself.
    Client,
}

/// What a `register` asks for its tree.
pub(in crate::daemon) struct Asked<'a> {
    /// The token of the lease to register under (another's, as `leash exec` does), if not
    /// the connection's own.
    pub token: Option<&'a str>,
    pub on_root_exit: Option<RootExitPolicy>,
    pub grace_ms: Option<u64>,
}

/// A tree's grace period: `grace_ms` if it is within the limit, the daemon's default if None.
pub(in crate::daemon) fn grace(
    daemon: &Daemon,
    grace_ms: Option<u64>,
) -> Result<Duration, Refusal> {
    match grace_ms {
        None => Ok(daemon.config.default_grace),
        Some(ms) if ms <= MAX_GRACE_MS => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(Refusal::new(
            ErrorCode::BadRequest,
            format!("grace_ms {ms} is over the limit of {MAX_GRACE_MS}"),
        )),
    }
}

/// How a `register` line names its process, as it came.
pub(in crate::daemon) struct Naming {
    /// Its `pid` field.
    pub pid: Option<u32>,
    /// Its `"pidfd": true`.
    pub pidfd: bool,
    /// The line's number on its connection (from 0), whose pidfd it takes.
    pub line_number: u64,
}

/// How a `register` request names its process: by a pid, by the pidfd sent with its line, or
/// (with neither) the client itself, as the kernel named it to the daemon when it connected:
/// right in whatever pid namespace the client runs. Only under another lease (`asked`'s token:
/// the exec shim's way): under its own, a client would be killed as its connection closed.
pub(in crate::daemon) fn named(
    peer: &Peer,
    pidfds: &Pidfds,
    naming: Naming,
    asked: &Asked<'_>,
) -> Result<Named, Refusal> {
    let Naming {
        pid,
        pidfd,
        line_number,
    } = naming;
    let has_token = asked.token.is_some();
    match (pid, pidfd) {
        (Some(_), true) => Err(Refusal::new(
            ErrorCode::BadRequest,
            "register names its process by a pid or by a pidfd, not both",
        )),
        (Some(pid), false) => {
            check_same_pid_namespace(peer, pid)?;
            Ok(Named::Pid(pid))
        }
        (None, true) => pidfds
            .take(line_number)
            .map(|fd| Named::Pidfd(Pidfd::from_checked(fd)))
            .ok_or_else(|| {
                Refusal::new(
                    ErrorCode::BadRequest,
                    "\"pidfd\": true, but no pidfd came with the request (send it with the \
                     line, as SCM_RIGHTS)",
                )
            }),
        (None, false) if has_token => Ok(Named::Client),
        (None, false) => Err(Refusal::new(
            ErrorCode::BadRequest,
            "register needs a pid or a pidfd, or a lease token to register the client \
             itself under (as `leash exec` does)",
        )),
    }
}

/// A pid is a number in its sender's pid namespace: from a client in another one (a
/// container's), it would name some other process of the daemon's. Such a client registers
/// itself (no pid) or names the process by a pidfd, which the kernel names right.
fn check_same_pid_namespace(peer: &Peer, pid: u32) -> Result<(), Refusal> {
    if peer.numbering.is_daemons() {
        return Ok(());
    }
    Err(Refusal::new(
        ErrorCode::BadRequest,
        format!(
            "pid {pid} is a number of the client's pid namespace, not the daemon's (the \
             client's is nested {} deep in it): a client in a container names the process by \
             a pidfd, or registers itself (as `leash exec` does)",
            peer.numbering.depth()
        ),
    ))
}

/// What a refused registration of process `pid` (of uids `target`) says: the refusal names the
/// uid whose right failed (with another lease's token, that may be the lease's holder's, not
/// the client's `uid`).
fn register_refusal(
    denied: RegisterDenied,
    pid: u32,
    target: ProcessUids,
    uid: u32,
    holder: u32,
) -> Refusal {
    let may_not_signal = |uid: u32, role: &str| {
        Refusal::new(
            ErrorCode::PermissionDenied,
            format!(
                "process {pid} belongs to uid {}; uid {uid}{role} may not signal it",
                target.real
            ),
        )
    };
    match denied {
        RegisterDenied::RequesterMayNotSignal => may_not_signal(uid, ""),
        RegisterDenied::HolderMayNotSignal => may_not_signal(holder, ", which holds the lease,"),
        RegisterDenied::OutsideOwnTree(own) => Refusal::new(
            ErrorCode::PermissionDenied,
            format!(
                "process {pid} is outside tree {own}, which the client runs in: a process in a \
                 tree may register only processes of its own tree"
            ),
        ),
        RegisterDenied::CapacityFull => Refusal::new(
            ErrorCode::LimitReached,
            "the daemon's tree capacity is full",
        ),
    }
}

/// Registers the process `named` for `peer`, as `asked`: grace, identify, lease, authorize
/// (`auth::may_register`), reserve, adopt, announce.
pub(in crate::daemon) async fn register(
    daemon: &Arc<Daemon>,
    peer: &Peer,
    named: Named,
    asked: Asked<'_>,
) -> Result<Reply, Refusal> {
    let grace = grace(daemon, asked.grace_ms)?;
    // The process itself, held by a pidfd from here on: everything below is checked on it
    // and done to it, whatever its pid comes to name later.
    let (process, pidfd) = match named {
        Named::Pid(pid) => identify(pid),
        Named::Client => identify(peer.process.pid),
        Named::Pidfd(pidfd) => identify_pidfd(pidfd),
    }?;
    let pid = process.pid;
    if pid <= 1 || pid == std::process::id() {
        return Err(Refusal::new(
            ErrorCode::BadRequest,
            format!("pid {pid} cannot be registered (init, 0, or the daemon itself)"),
        ));
    }
    let found =
        daemon
            .registry
            .lease_for(peer.lease, asked.token)
            .map_err(|missing| match missing {
                NoLease::Own => Refusal::new(ErrorCode::Internal, "this connection has no lease"),
                NoLease::Token => Refusal::new(ErrorCode::NotFound, "no live lease has that token"),
            })?;
    let (lease, mut holder) = (found.lease, found.holder);
    let owner_uid = holder.owner_uid;
    let on_root_exit = asked.on_root_exit.unwrap_or_default();
    holder.grace_ms = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
    if on_root_exit == RootExitPolicy::Keep {
        holder.flags |= holder_flags::KEEP_ON_ROOT_EXIT;
    }
    if pid == peer.process.pid && process != peer.process {
        return Err(Refusal::new(
            ErrorCode::NotFound,
            format!("the client's process {pid} has exited"),
        ));
    }
    let target = ProcessUids::of(pid)
        .filter(|_| !pidfd.has_exited())
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no process {pid}")))?;
    let requester = ProcessUids::of(peer.process.pid).unwrap_or(ProcessUids::all(peer.uid));
    // What a process in a tree registers is nested in that tree (and a process that is in a
    // tree already stays in it: see Tracker::start_adoption).
    let nest_in = peer.confinement(&daemon.view).first().copied();
    let target_trees = daemon
        .view
        .member(pid)
        .filter(|member| process.is(member))
        .map(|member| daemon.view.enclosing(member.tree))
        .unwrap_or_default();
    let facts = RegisterFacts {
        requester,
        holder: owner_uid,
        target,
        confined_in: nest_in,
        target_trees: &target_trees,
        capacity_full: daemon.registry.tree_count() >= daemon.view.capacity().trees as usize,
    };
    may_register(facts)
        .map_err(|denied| register_refusal(denied, pid, target, peer.uid, owner_uid))?;
    // One /proc walk per account at a time: a user's registrations queue behind each other,
    // not in front of anyone else's.
    let _turn = daemon.limits.heavy(peer.account).await;
    // A tree registered with another lease's token counts against both accounts; its place in
    // their quotas is taken now, and held until it is filed.
    let reservation = daemon
        .registry
        .reserve(
            &[holder.account, peer.account],
            daemon.config.max_trees_per_uid,
        )
        .map_err(|OverQuota { account, held }| {
            Refusal::new(
                ErrorCode::LimitReached,
                format!("{} holds {held} trees, the most allowed", describe(account)),
            )
        })?;
    let numbers = root_numbers(pid);
    let audience = Audience {
        owner_uid,
        registered_from: found.pid_namespaces.clone(),
    };
    let host_pid = holder.host_pid;
    let entry = TreeEntry::new(
        lease,
        &holder,
        peer.account,
        found.pid_namespaces,
        numbers.clone(),
        on_root_exit,
        grace,
    );
    let adopted = adopt(daemon, process, nest_in, holder, entry, reservation).await;
    daemon.memory_freed();
    let tree: TreeId = adopted?;
    daemon.registry.lease_holds_a_tree(lease);
    daemon.metrics.tree_registered();
    let status = daemon.view.tree_status(tree).ok();
    let (members, nested_in) = (
        status.map_or(0, |s| s.members),
        status.and_then(|s| s.parent),
    );
    tracing::info!(
        parent: None,
        event = "tree_registered",
        tree,
        lease,
        host_pid,
        uid = owner_uid,
        root = pid,
        members,
        nested_in,
        "tree registered"
    );
    let registered = Event::new(EventKind::Registered, tree, lease, Some(pid));
    daemon.emit_about_root(&audience, registered, &numbers);
    Ok(Reply::Registered {
        tree,
        root: peer.numbering.pick(&numbers),
        members,
    })
}
