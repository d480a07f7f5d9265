//! What each request does. A request that is malformed, not allowed or impossible gets an
//! error reply and changes nothing.

use std::{
    collections::HashMap,
    rc::Rc,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use leash_client::protocol::{
    DecodeError, ErrorCode, LeaseId, MAX_GRACE_MS, MAX_LISTED, MAX_LISTED_PER_TREE, MemberInfo, Op,
    PROTOCOL_VERSION, Reply, Request, RootExitPolicy, ServerLine, StatusInfo, TreeId, TreeInfo,
    decode_request,
};
use leash_common::{Account, Holder, Member, Pid, holder_flags};

use super::identity::describe;

use crate::{
    kernel::{Adoption, IdentifyError, KillError, identify, identify_pidfd},
    proc::{self, ProcessRef},
    sys::Pidfd,
};

use super::{
    Daemon, TreeEntry,
    auth::{
        ProcessUids, Requester, TreeFacts, Verdict, may_kill, may_manage, may_release, may_see,
        may_signal,
    },
    connection::Peer,
    enforcement,
    outbox::Outbox,
    owner::Owner,
    pid_view::PidView,
    request_stream::{Pidfds, Strangers},
    subscribers::{Audience, Hears},
};

/// What a request costs of its uid's budget (see `limits`): most are map lookups; these read
/// /proc or walk the member map.
const HEAVY_COST: u32 = 20;
/// Processes one owner job seeds while a tree is adopted: a short step (a few ms: a kill under
/// way waits for at most one such step between its own).
const SEED_CHUNK: usize = 64;

/// One connection's side of request handling.
pub struct Session {
    pub peer: Peer,
    pub outbox: Outbox,
    pub subscribed: bool,
    /// The pidfds this connection sent, for the requests that name their process by one.
    pub pidfds: Pidfds,
    /// The lines that a process other than the host sent on this connection.
    pub strangers: Strangers,
}

/// How a `register` names its process.
enum Named {
    /// A number of the daemon's pid namespace.
    Pid(u32),
    /// A pidfd sent with the request.
    Pidfd(Pidfd),
    /// The client itself.
    Client,
}

/// Why a request was refused: becomes the error reply.
struct Refusal {
    code: ErrorCode,
    message: String,
}

/// The tree a request names, if it names one.
fn op_tree(op: &Op) -> Option<TreeId> {
    match op {
        Op::Release { tree } | Op::Kill { tree, .. } => Some(*tree),
        Op::List { tree } => *tree,
        _ => None,
    }
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

impl Session {
    /// Handles one request line. Replies go to the outbox; a kill's reply goes when the tree is
    /// empty, while the connection goes on serving. Err: the uid is over its request rate (the
    /// request was refused); the connection should read nothing more for that long.
    pub async fn handle(
        &mut self,
        daemon: &Arc<Daemon>,
        line: &[u8],
        line_number: u64,
    ) -> Result<(), Duration> {
        let Request { id, op } = match decode_request(line) {
            Ok(request) => request,
            Err(DecodeError { id, message }) => {
                self.send_error(id, ErrorCode::BadRequest, message);
                return daemon.limits.spend(self.peer.account, 1);
            }
        };
        // A lease is its host's: a request another process sent on its connection (a socket
        // leaked to a child, or taken from the host) is refused, and the lease goes on.
        if let Some(sender) = self.strangers.sender_of(line_number) {
            let message = format!(
                "this request was sent by process {sender}, not by process {} that opened this \
                 lease: a lease serves its host alone (a process of another connection, or one \
                 that forked from the host, opens a lease of its own)",
                self.peer.pid
            );
            tracing::debug!(id, sender, "request not sent by the lease's host");
            self.refused(id, op_tree(&op), ErrorCode::PermissionDenied, &message);
            self.outbox.reply(&ServerLine::error(
                Some(id),
                ErrorCode::PermissionDenied,
                message,
            ));
            return daemon.limits.spend(self.peer.account, 1);
        }
        let cost = match op {
            Op::Register { .. } | Op::List { .. } => HEAVY_COST,
            _ => 1,
        };
        if let Err(pause) = daemon.limits.spend(self.peer.account, cost) {
            let limits = daemon.limits.limits();
            self.outbox.reply(&ServerLine::error(
                Some(id),
                ErrorCode::LimitReached,
                format!(
                    "{} is over its {} requests a second (list and register count {HEAVY_COST}); \
                     retry in {} ms",
                    describe(self.peer.account),
                    limits.requests_per_second,
                    pause.as_millis().max(1)
                ),
            ));
            return Err(pause);
        }
        tracing::debug!(id, ?op, "request");
        let tree = op_tree(&op);
        let reply = match op {
            Op::Hello { protocol } => self.hello(daemon, protocol),
            Op::Register {
                pid,
                pidfd,
                lease,
                on_root_exit,
                grace_ms,
            } => match self.named(pid, pidfd, lease.is_some(), line_number) {
                Ok(named) => {
                    self.register(daemon, named, lease.as_deref(), on_root_exit, grace_ms)
                        .await
                }
                Err(refusal) => Err(refusal),
            },
            Op::Release { tree } => self.release(daemon, tree).await,
            Op::Kill { tree, grace_ms } => match self.kill(daemon, id, tree, grace_ms).await {
                Ok(()) => return Ok(()),
                Err(refusal) => Err(refusal),
            },
            Op::List { tree } => self.list(daemon, tree).await,
            Op::Subscribe => Ok(self.subscribe(daemon)),
            Op::Status => self.status(daemon),
        };
        let line = match reply {
            Ok(reply) => ServerLine::ok(id, reply),
            Err(Refusal { code, message }) => {
                self.refused(id, tree, code, &message);
                ServerLine::error(Some(id), code, message)
            }
        };
        self.outbox.reply(&line);
        Ok(())
    }

    /// A pid is a number in its sender's pid namespace: from a client in another one (a
    /// container's), it would name some other process of the daemon's. Such a client registers
    /// itself (no pid) or names the process by a pidfd, which the kernel names right.
    fn check_same_pid_namespace(&self, pid: u32) -> Result<(), Refusal> {
        let view = self.peer.view;
        if view.is_daemons() {
            return Ok(());
        }
        Err(refuse(
            ErrorCode::BadRequest,
            format!(
                "pid {pid} is a number of the client's pid namespace, not the daemon's (the \
                 client's is nested {} deep in it): a client in a container names the \
                 process by a pidfd, or registers itself (as `leash exec` does)",
                view.depth()
            ),
        ))
    }

    /// The INFO line of a request refused (`request_refused`): what was asked (and of which
    /// tree), the refusal's code, and why. A line that is no request, and a request over its
    /// uid's rate, are not logged one by one: a client in a loop must not fill the log.
    fn refused(&self, request: u64, tree: Option<TreeId>, code: ErrorCode, reason: &str) {
        tracing::info!(
            parent: None,
            event = "request_refused",
            request,
            tree,
            lease = self.peer.lease,
            host_pid = self.peer.pid,
            uid = self.peer.uid,
            code = %code,
            reason,
            "request refused"
        );
    }

    fn send_error(&self, id: Option<u64>, code: ErrorCode, message: String) {
        // Debug only: a flood of bad lines must not flood the log (it is rate-limited anyway).
        tracing::debug!(?id, %code, message, "bad request");
        self.outbox.reply(&ServerLine::error(id, code, message));
    }

    fn hello(&self, daemon: &Daemon, protocol: u32) -> Result<Reply, Refusal> {
        if protocol != PROTOCOL_VERSION {
            return Err(refuse(
                ErrorCode::UnsupportedVersion,
                format!("this daemon speaks protocol {PROTOCOL_VERSION}, not {protocol}"),
            ));
        }
        let state = daemon.state();
        let lease = state
            .leases
            .get(&self.peer.lease)
            .ok_or_else(|| refuse(ErrorCode::Internal, "this connection has no lease"))?;
        Ok(Reply::Hello {
            protocol: PROTOCOL_VERSION,
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            lease: leash_client::LeaseInfo {
                id: self.peer.lease,
                token: lease.token.clone(),
            },
        })
    }

    /// How a `register` request (line `line_number` of the connection) names its process: by a
    /// pid, by the pidfd sent with its line, or (with
    /// neither) the client itself, as the kernel named it to the daemon when it connected: right
    /// in whatever pid namespace the client runs. Only under another lease (the exec shim's
    /// way): under its own, a client would be killed as its connection closed.
    fn named(
        &self,
        pid: Option<u32>,
        pidfd: bool,
        has_token: bool,
        line_number: u64,
    ) -> Result<Named, Refusal> {
        match (pid, pidfd) {
            (Some(_), true) => Err(refuse(
                ErrorCode::BadRequest,
                "register names its process by a pid or by a pidfd, not both",
            )),
            (Some(pid), false) => {
                self.check_same_pid_namespace(pid)?;
                Ok(Named::Pid(pid))
            }
            (None, true) => self
                .pidfds
                .take(line_number)
                .map(|fd| Named::Pidfd(Pidfd::from_checked(fd)))
                .ok_or_else(|| {
                    refuse(
                        ErrorCode::BadRequest,
                        "\"pidfd\": true, but no pidfd came with the request (send it with the \
                         line, as SCM_RIGHTS)",
                    )
                }),
            (None, false) if has_token => Ok(Named::Client),
            (None, false) => Err(refuse(
                ErrorCode::BadRequest,
                "register needs a pid or a pidfd, or a lease token to register the client \
                 itself under (as `leash exec` does)",
            )),
        }
    }

    async fn register(
        &self,
        daemon: &Arc<Daemon>,
        named: Named,
        token: Option<&str>,
        on_root_exit: Option<RootExitPolicy>,
        grace_ms: Option<u64>,
    ) -> Result<Reply, Refusal> {
        let grace = grace(daemon, grace_ms)?;
        // The process itself, held by a pidfd from here on: everything below is checked on it
        // and done to it, whatever its pid comes to name later.
        let identified = match named {
            Named::Pid(pid) => identify(pid),
            Named::Client => identify(self.peer.pid),
            Named::Pidfd(pidfd) => identify_pidfd(pidfd),
        };
        let (process, pidfd) = identified.map_err(|e| {
            let code = match e {
                IdentifyError::NotFound(_) | IdentifyError::Exiting(_) | IdentifyError::Gone => {
                    ErrorCode::NotFound
                }
                IdentifyError::Thread { .. }
                | IdentifyError::NotPidfd
                | IdentifyError::Invisible => ErrorCode::BadRequest,
                IdentifyError::Io(..) => ErrorCode::Internal,
            };
            refuse(code, e.to_string())
        })?;
        let pid = process.pid;
        if pid <= 1 || pid == std::process::id() {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("pid {pid} cannot be registered (init, 0, or the daemon itself)"),
            ));
        }
        let (lease, mut holder, registered_from) = self.lease_for(daemon, token)?;
        let owner_uid = holder.owner_uid;
        let on_root_exit = on_root_exit.unwrap_or_default();
        holder.grace_ms = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
        if on_root_exit == RootExitPolicy::Keep {
            holder.flags |= holder_flags::KEEP_ON_ROOT_EXIT;
        }
        if pid == self.peer.pid
            && self.peer.start_ticks != 0
            && process.start_ticks != self.peer.start_ticks
        {
            return Err(refuse(
                ErrorCode::NotFound,
                format!("the client's process {pid} has exited"),
            ));
        }
        let target = ProcessUids::of(pid)
            .filter(|_| !pidfd.has_exited())
            .ok_or_else(|| refuse(ErrorCode::NotFound, format!("no process {pid}")))?;
        // Whoever asks, and whoever will hold the tree, must both be allowed to signal it.
        let requester = ProcessUids::of(self.peer.pid).unwrap_or(ProcessUids {
            real: self.peer.uid,
            effective: self.peer.uid,
            saved: self.peer.uid,
        });
        let owner = ProcessUids {
            real: owner_uid,
            effective: owner_uid,
            saved: owner_uid,
        };
        // The refusal names the uid whose right failed: with another lease's token, that may
        // be the lease's owner and not the client.
        let denied = |uid: u32, role: &str| {
            refuse(
                ErrorCode::PermissionDenied,
                format!(
                    "process {pid} belongs to uid {}; uid {uid}{role} may not signal it",
                    target.real
                ),
            )
        };
        if !may_signal(requester, target) {
            return Err(denied(self.peer.uid, ""));
        }
        if !may_signal(owner, target) {
            return Err(denied(owner_uid, ", which holds the lease,"));
        }
        // One /proc walk per account at a time: a user's registrations queue behind each
        // other, not in front of anyone else's. Taken before the limits are checked, so that
        // the check sees every tree the account's earlier registrations filed.
        let _turn = daemon.limits.heavy(self.peer.account).await;
        // A tree registered with another lease's token counts against both accounts.
        self.check_limits(daemon, holder.account)?;
        if self.peer.account != holder.account {
            self.check_limits(daemon, self.peer.account)?;
        }
        // What a process in a tree registers is nested in that tree (and a process that is in
        // a tree already stays in it: see Tracker::start_adoption), and it may register only
        // what is in its tree already: its host, or any process outside, would otherwise come
        // under the agent's tree, and the host's own kill and release of it would find nothing.
        let confinement = self.confinement(daemon);
        let nest_in = confinement.first().copied();
        if let Some(own) = nest_in {
            let inside = daemon.view.member(pid).is_some_and(|member| {
                proc::ns_to_ticks(member.start_ns) == process.start_ticks
                    && daemon.view.enclosing(member.tree).contains(&own)
            });
            if !inside {
                return Err(refuse(
                    ErrorCode::PermissionDenied,
                    format!(
                        "process {pid} is outside tree {own}, which the client runs in: a                          process in a tree may register only processes of its own tree"
                    ),
                ));
            }
        }
        // A first look (the owner checks again as it makes the tree).
        if daemon.state().trees.len() >= daemon.view.capacity().trees as usize {
            return Err(refuse(
                ErrorCode::LimitReached,
                "the daemon's tree capacity is full",
            ));
        }
        let numbers = root_numbers(pid);
        let audience = Audience {
            owner: owner_uid,
            registered_from: registered_from.clone(),
        };
        let host_pid = holder.host_pid;
        let entry = TreeEntry {
            lease,
            owner_uid,
            host_pid,
            account: holder.account,
            registrar_account: self.peer.account,
            registered_from,
            root: numbers.clone(),
            on_root_exit,
            grace,
            root_exited: false,
            kill: None,
            unkillable: false,
        };
        let adopted = adopt(daemon, process, nest_in, holder, entry).await;
        daemon.memory_freed.store(true, Ordering::Relaxed);
        let tree = adopted?;
        daemon.lease_holds_a_tree(lease);
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
        let registered = enforcement::registered_event(tree, lease, pid);
        daemon.emit_about_root(&audience, registered, &numbers);
        Ok(Reply::Registered {
            tree,
            root: self.peer.view.pick(&numbers),
            members,
        })
    }

    /// The tree the client's process runs in, then each tree that one is nested in; empty
    /// when it runs in none. The trees it may never release or kill.
    fn confinement(&self, daemon: &Daemon) -> Vec<TreeId> {
        let view = &daemon.view;
        match view.member(self.peer.pid) {
            // The start time tells the client's process from an earlier one by the same pid;
            // unknown (0), the entry is taken as the client's: fail closed.
            Some(member)
                if self.peer.start_ticks == 0
                    || proc::ns_to_ticks(member.start_ns) == self.peer.start_ticks =>
            {
                view.enclosing(member.tree)
            }
            _ => Vec::new(),
        }
    }

    /// The rules' view of the client.
    fn requester<'a>(&self, confined: &'a [TreeId]) -> Requester<'a> {
        Requester {
            uid: self.peer.uid,
            lease: self.peer.lease,
            confined,
            pid_namespace: self.peer.pid_namespace,
        }
    }

    /// The verdict of `rule` on `tree`, as a refusal if it is not allowed.
    fn authorize(
        &self,
        daemon: &Daemon,
        tree: TreeId,
        rule: fn(Requester<'_>, TreeFacts<'_>) -> Verdict,
    ) -> Result<(), Refusal> {
        let confined = self.confinement(daemon);
        let Some((lease, owner, registered_from)) = daemon
            .state()
            .trees
            .get(&tree)
            .map(|entry| (entry.lease, entry.owner_uid, entry.registered_from.clone()))
        else {
            return Err(not_found(tree));
        };
        let chain = daemon.view.enclosing(tree);
        let facts = TreeFacts {
            lease,
            owner,
            chain: &chain,
            registered_from: &registered_from,
        };
        match rule(self.requester(&confined), facts) {
            Verdict::Allowed => Ok(()),
            Verdict::Hidden => Err(not_found(tree)),
            Verdict::Denied(why) => Err(refuse(
                ErrorCode::PermissionDenied,
                format!("tree {tree}: uid {} is refused: {why}", self.peer.uid),
            )),
        }
    }

    /// The lease a new tree goes under, who holds it, and the pid namespaces of its host (the
    /// tree is registered from there): this connection's, or the one a token names.
    fn lease_for(
        &self,
        daemon: &Daemon,
        token: Option<&str>,
    ) -> Result<(LeaseId, Holder, Arc<[u32]>), Refusal> {
        let state = daemon.state();
        let found = match token {
            None => state
                .leases
                .get(&self.peer.lease)
                .map(|lease| (self.peer.lease, lease)),
            Some(token) => state
                .leases
                .iter()
                .find(|(_, lease)| lease.token == token)
                .map(|(&id, lease)| (id, lease)),
        };
        let (id, lease) = found.ok_or_else(|| match token {
            None => refuse(ErrorCode::Internal, "this connection has no lease"),
            Some(_) => refuse(ErrorCode::NotFound, "no live lease has that token"),
        })?;
        let holder = Holder {
            host_pid: lease.host_pid,
            owner_uid: lease.uid,
            host_start_ticks: lease.host_start_ticks,
            account: lease.account,
            ..Holder::default()
        };
        Ok((id, holder, lease.pid_namespaces.clone()))
    }

    fn check_limits(&self, daemon: &Daemon, account: Account) -> Result<(), Refusal> {
        if account == 0 {
            return Ok(());
        }
        let held = daemon
            .state()
            .trees
            .values()
            .filter(|t| t.account == account || t.registrar_account == account)
            .count();
        let limit = daemon.config.max_trees_per_uid;
        if held >= limit {
            return Err(refuse(
                ErrorCode::LimitReached,
                format!("{} holds {held} trees, the most allowed", describe(account)),
            ));
        }
        Ok(())
    }

    async fn release(&self, daemon: &Daemon, tree: TreeId) -> Result<Reply, Refusal> {
        self.authorize(daemon, tree, may_release)?;
        let entry = {
            let mut state = daemon.state();
            match state.trees.get(&tree) {
                None => return Err(not_found(tree)),
                Some(entry) if entry.kill.is_some() || entry.unkillable => {
                    return Err(refuse(
                        ErrorCode::BadRequest,
                        format!("tree {tree} is being killed"),
                    ));
                }
                Some(_) => state.trees.remove(&tree).expect("checked above"),
            }
        };
        daemon
            .jobs
            .request(move |owner| owner.tracker().release(tree))
            .await
            .ok_or_else(stopping)?
            .map_err(|e| refuse(ErrorCode::Internal, format!("{e:#}")))?;
        tracing::info!(tree, "tree released");
        daemon.emit(
            &entry.audience(),
            enforcement::released_event(tree, entry.lease),
        );
        Ok(Reply::Released { tree })
    }

    async fn kill(
        &self,
        daemon: &Arc<Daemon>,
        id: u64,
        tree: TreeId,
        grace_ms: Option<u64>,
    ) -> Result<(), Refusal> {
        let grace = grace_ms.map(|ms| grace(daemon, Some(ms))).transpose()?;
        self.authorize(daemon, tree, may_kill)?;
        let pending = daemon
            .jobs
            .urgent_with(move |owner| enforcement::start_kill(owner, tree, grace, "request"))
            .await
            .ok_or_else(stopping)?
            .ok_or_else(|| not_found(tree))?;
        let outbox = self.outbox.clone();
        tokio::spawn(async move {
            let line = match enforcement::outcome(pending).await {
                Ok(summary) => ServerLine::ok(id, Reply::Killed(summary)),
                Err(e @ KillError::Unkillable { .. }) => {
                    ServerLine::error(Some(id), ErrorCode::KillFailed, e.to_string())
                }
                Err(e) => ServerLine::error(Some(id), ErrorCode::Internal, e.to_string()),
            };
            outbox.reply(&line);
        });
        Ok(())
    }

    /// The trees the client may see, with their members. The member map is read once, and
    /// /proc once per listed member, by a blocking thread and under no lock; the reply is
    /// bounded (see `MAX_LISTED`) whatever the trees' sizes.
    async fn list(&self, daemon: &Arc<Daemon>, only: Option<TreeId>) -> Result<Reply, Refusal> {
        let confined = self.confinement(daemon);
        let who = self.requester(&confined);
        let mut trees: Vec<TreeInfo> = {
            let state = daemon.state();
            state
                .trees
                .iter()
                .filter(|(tree, _)| only.is_none_or(|only| only == **tree))
                .filter_map(|(&tree, entry)| {
                    let chain = daemon.view.enclosing(tree);
                    let facts = TreeFacts {
                        lease: entry.lease,
                        owner: entry.owner_uid,
                        chain: &chain,
                        registered_from: &entry.registered_from,
                    };
                    may_see(who, facts)
                        .then(|| tree_info(tree, entry, &state, chain.get(1), self.peer.view))
                })
                .collect()
        };
        trees.sort_by_key(|t| t.tree);
        if trees.is_empty() {
            return Ok(Reply::Trees(trees));
        }
        let _turn = daemon.limits.heavy(self.peer.account).await;
        let (daemon, view) = (daemon.clone(), self.peer.view);
        tokio::task::spawn_blocking(move || {
            let entries = daemon.view.member_entries()?;
            fill_members(&mut trees, entries, view);
            Ok(trees)
        })
        .await
        .map_err(|e| refuse(ErrorCode::Internal, e.to_string()))?
        .map(Reply::Trees)
        .map_err(|e: anyhow::Error| refuse(ErrorCode::Internal, format!("{e:#}")))
    }

    fn subscribe(&mut self, daemon: &Daemon) -> Reply {
        if !self.subscribed {
            self.subscribed = true;
            // A process in a tree hears only of its own lease's trees; any other, of its uid's.
            let hears = if !self.confinement(daemon).is_empty() {
                Hears::Lease(self.peer.lease)
            } else if self.peer.uid == 0 {
                Hears::Everything
            } else {
                Hears::Uid(self.peer.uid)
            };
            daemon.subscribers.add(
                hears,
                self.peer.lease,
                self.outbox.clone(),
                self.peer.view,
                self.peer.pid_namespace,
            );
        }
        Reply::Subscribed
    }
}

impl Session {
    fn status(&self, daemon: &Daemon) -> Result<Reply, Refusal> {
        let (trees, leases): (Vec<TreeId>, usize) = {
            let state = daemon.state();
            let leases = state
                .leases
                .values()
                .filter(|lease| {
                    may_manage(self.peer.uid, lease.uid)
                        && lease.pid_namespaces.contains(&self.peer.pid_namespace)
                })
                .count();
            (state.trees.keys().copied().collect(), leases)
        };
        let view = &daemon.view;
        let internal = |e: anyhow::Error| refuse(ErrorCode::Internal, format!("{e:#}"));
        let stats = view.stats().map_err(internal)?;
        let members = view.members_of(&trees);
        let capacity = view.capacity();
        Ok(Reply::Status(StatusInfo {
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: PROTOCOL_VERSION,
            programs: crate::kernel::PROGRAMS_ATTACHED
                .iter()
                .chain(daemon.ptrace_guard.programs())
                .map(|(name, at)| format!("{name} ({at})"))
                .collect(),
            member_capacity: capacity.members,
            members,
            tree_capacity: capacity.trees,
            trees: trees.len() as u64,
            leases: leases as u64,
            events_dropped: stats.events_dropped,
            inserts_failed: stats.inserts_failed,
            pinned_at: daemon
                .pinned_at
                .as_ref()
                .map(|dir| dir.display().to_string()),
        }))
    }
}

fn grace(daemon: &Daemon, grace_ms: Option<u64>) -> Result<Duration, Refusal> {
    match grace_ms {
        None => Ok(daemon.config.default_grace),
        Some(ms) if ms <= MAX_GRACE_MS => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(refuse(
            ErrorCode::BadRequest,
            format!("grace_ms {ms} is over the limit of {MAX_GRACE_MS}"),
        )),
    }
}

/// Trees a client may not see are reported as missing, not as forbidden.
fn not_found(tree: TreeId) -> Refusal {
    refuse(ErrorCode::NotFound, format!("no tree {tree}"))
}

/// The owner has stopped: the daemon is exiting.
fn stopping() -> Refusal {
    refuse(ErrorCode::Internal, "the daemon is stopping")
}

/// Registers `process` as the root of a new tree with every descendant it has, and files it
/// as `entry`. The owner does the map work in short steps; the /proc walks between them run on
/// a blocking thread. Safe in pieces: from the first step on, the kernel follows every fork of
/// a seeded member, and each process found is checked again as it is seeded; a pass that finds
/// nothing new ends it. Until its last step files it, the tree is in no one's hands, so no kill
/// and no release can come between the steps: the last step sees whether its lease or the tree
/// it is nested in ended meanwhile, and then kills it.
async fn adopt(
    daemon: &Arc<Daemon>,
    process: ProcessRef,
    nest_in: Option<TreeId>,
    holder: Holder,
    entry: TreeEntry,
) -> Result<TreeId, Refusal> {
    let mut adoption = daemon
        .jobs
        .request(move |owner| owner.tracker().start_adoption(process, nest_in, holder))
        .await
        .ok_or_else(stopping)?
        .map_err(|e| refuse(ErrorCode::NotFound, format!("{e:#}")))?;
    while adoption.wants_pass() {
        if let Err(e) = seed_pass(daemon, &mut adoption).await {
            daemon
                .jobs
                .request(move |owner| owner.tracker().abandon_adoption(adoption))
                .await;
            return Err(refuse(ErrorCode::NotFound, format!("{e:#}")));
        }
    }
    daemon
        .jobs
        .request(move |owner| file_adopted(owner, adoption, entry))
        .await
        .ok_or_else(stopping)?
}

/// One pass of an adoption: /proc is walked on a blocking thread, what it found is seeded by
/// the owner in short chunks.
async fn seed_pass(daemon: &Arc<Daemon>, adoption: &mut Adoption) -> anyhow::Result<()> {
    let (tree, root) = (adoption.tree(), adoption.root());
    let found = {
        let daemon = daemon.clone();
        tokio::task::spawn_blocking(move || daemon.view.find_descendants(tree, root)).await??
    };
    let mut new = 0;
    for chunk in found.chunks(SEED_CHUNK) {
        let chunk = chunk.to_vec();
        new += daemon
            .jobs
            .request(move |owner| owner.tracker().seed_found(tree, &chunk))
            .await
            .ok_or_else(|| anyhow::anyhow!("the daemon is stopping"))??;
    }
    adoption.end_pass(new)
}

/// The last step of an adoption, on the owner: the tree is registered and filed. If its lease
/// ended meanwhile, or the tree it is nested in is being killed or is gone, it is killed now:
/// what it took from that tree was out of that tree's kill.
fn file_adopted(
    owner: &Rc<Owner>,
    adoption: Adoption,
    entry: TreeEntry,
) -> Result<TreeId, Refusal> {
    let enclosing = adoption.enclosing();
    let tree = owner
        .tracker()
        .finish_adoption(adoption)
        .map_err(|e| refuse(ErrorCode::NotFound, format!("{e:#}")))?;
    let ended = {
        let mut state = owner.daemon.state();
        let lease_ended = !state.leases.contains_key(&entry.lease);
        let enclosing_ended = enclosing.is_some_and(|outer| {
            state
                .trees
                .get(&outer)
                .is_none_or(|outer| outer.kill.is_some())
        });
        state.trees.insert(tree, entry);
        if lease_ended {
            Some("lease_ended")
        } else if enclosing_ended {
            Some("enclosing_killed")
        } else {
            None
        }
    };
    match ended {
        None => Ok(tree),
        Some(reason) => {
            enforcement::start_kill(owner, tree, None, reason);
            Err(refuse(
                ErrorCode::NotFound,
                format!("tree {tree} was killed as it was registered ({reason})"),
            ))
        }
    }
}

/// A tree as `list` shows it, members not filled in yet.
fn tree_info(
    tree: TreeId,
    entry: &TreeEntry,
    state: &super::State,
    nested_in: Option<&TreeId>,
    view: PidView,
) -> TreeInfo {
    let host_pid = state.leases.get(&entry.lease).map_or(0, |l| l.host_pid);
    TreeInfo {
        tree,
        lease: entry.lease,
        owner_uid: entry.owner_uid,
        root: view.pick(&entry.root),
        on_root_exit: entry.on_root_exit,
        grace_ms: u64::try_from(entry.grace.as_millis()).unwrap_or(u64::MAX),
        host_pid,
        host_comm: None,
        root_exited: entry.root_exited,
        state: match (&entry.kill, entry.unkillable) {
            (Some(_), _) => "killing",
            (None, true) => "unkillable",
            (None, false) => "live",
        }
        .to_owned(),
        nested_in: nested_in.copied(),
        member_count: 0,
        members_truncated: false,
        members: Vec::new(),
    }
}

/// Fills each tree's members from one read of the member map, the oldest first, at most
/// `MAX_LISTED_PER_TREE` each and `MAX_LISTED` in all, with what each runs now from /proc; and
/// gives every pid (host, members, their parents) as `view` numbers it.
fn fill_members(trees: &mut [TreeInfo], entries: Vec<(Pid, Member)>, view: PidView) {
    let mut by_tree: HashMap<TreeId, Vec<(Pid, Member)>> = HashMap::new();
    for (pid, member) in entries {
        by_tree.entry(member.tree).or_default().push((pid, member));
    }
    let mut room = MAX_LISTED;
    for info in trees {
        info.host_comm = proc::process(info.host_pid).map(|p| p.comm);
        info.host_pid = view.number(info.host_pid);
        let mut members = by_tree.remove(&info.tree).unwrap_or_default();
        info.member_count = members.len() as u64;
        members.sort_by_key(|(_, m)| m.start_ns);
        let listed = members.len().min(MAX_LISTED_PER_TREE).min(room);
        room -= listed;
        info.members_truncated = listed < members.len();
        info.members = members[..listed]
            .iter()
            .map(|&(pid, m)| MemberInfo {
                pid: view.number(pid),
                parent: view.number(m.parent),
                start_ns: m.start_ns,
                comm: proc::process(pid).map(|p| p.comm),
            })
            .collect();
    }
}

/// The numbers process `pid` has in each pid namespace it is in (just `pid` if they cannot be
/// read): what names a tree's root to clients in containers, even after it has exited.
pub(super) fn root_numbers(pid: Pid) -> Box<[Pid]> {
    proc::namespace_pids(pid)
        .filter(|numbers| numbers.first() == Some(&pid))
        .unwrap_or_else(|| vec![pid])
        .into()
}
