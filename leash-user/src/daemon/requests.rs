//! What each request does. A request that is malformed, not allowed or impossible gets an
//! error reply and changes nothing.

use std::{collections::HashMap, sync::Arc, time::Duration};

use leash_client::protocol::{
    ErrorCode, EventKind, LeaseId, MAX_GRACE_MS, MemberInfo, Op, PROTOCOL_VERSION, Reply, Request,
    RootExitPolicy, ServerLine, StatusInfo, TreeId, TreeInfo,
};
use leash_common::{Holder, holder_flags};

use crate::kernel::{IdentifyError, KillError, identify};
use tokio::sync::{broadcast::error::RecvError, watch};

use super::{
    Daemon, TreeEntry,
    auth::{
        ProcessUids, Requester, TreeFacts, Verdict, may_kill, may_manage, may_release, may_see,
        may_signal,
    },
    connection::{Outbox, Peer, Undelivered},
    enforcement,
};

/// One connection's side of request handling.
pub struct Session {
    pub peer: Peer,
    pub outbox: Outbox,
    /// Flips to true when the connection ends, so its helper tasks stop.
    pub closing: watch::Receiver<bool>,
    pub subscribed: bool,
}

/// Why a request was refused: becomes the error reply.
struct Refusal {
    code: ErrorCode,
    message: String,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

impl Session {
    /// Handles one request line. Replies go to the outbox; a kill's reply goes when the tree is
    /// empty, while the connection goes on serving.
    pub fn handle(&mut self, daemon: &Arc<Daemon>, line: &[u8]) {
        let value: serde_json::Value = match serde_json::from_slice(line) {
            Ok(value) => value,
            Err(e) => {
                return self.send_error(None, ErrorCode::BadRequest, format!("not JSON: {e}"));
            }
        };
        let id = value.get("id").and_then(serde_json::Value::as_u64);
        let Request { id, op } = match serde_json::from_value(value) {
            Ok(request) => request,
            Err(e) => return self.send_error(id, ErrorCode::BadRequest, e.to_string()),
        };
        tracing::debug!(id, ?op, "request");
        let reply = match op {
            Op::Hello { protocol } => self.hello(daemon, protocol),
            Op::Register {
                pid,
                lease,
                on_root_exit,
                grace_ms,
            } => self.register(daemon, pid, lease.as_deref(), on_root_exit, grace_ms),
            Op::Release { tree } => self.release(daemon, tree),
            Op::Kill { tree, grace_ms } => match self.kill(daemon, id, tree, grace_ms) {
                Ok(()) => return,
                Err(refusal) => Err(refusal),
            },
            Op::List => Ok(self.list(daemon)),
            Op::Subscribe => Ok(self.subscribe(daemon)),
            Op::Status => self.status(daemon),
        };
        let line = match reply {
            Ok(reply) => ServerLine::ok(id, reply),
            Err(Refusal { code, message }) => {
                tracing::info!(id, %code, message, "request refused");
                ServerLine::error(Some(id), code, message)
            }
        };
        self.outbox.reply(line);
    }

    fn send_error(&self, id: Option<u64>, code: ErrorCode, message: String) {
        tracing::info!(?id, %code, message, "bad request");
        self.outbox.reply(ServerLine::error(id, code, message));
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

    fn register(
        &self,
        daemon: &Arc<Daemon>,
        pid: u32,
        token: Option<&str>,
        on_root_exit: Option<RootExitPolicy>,
        grace_ms: Option<u64>,
    ) -> Result<Reply, Refusal> {
        let grace = grace(daemon, grace_ms)?;
        if pid <= 1 || pid == std::process::id() {
            return Err(refuse(
                ErrorCode::BadRequest,
                format!("pid {pid} cannot be registered (init, 0, or the daemon itself)"),
            ));
        }
        let (lease, mut holder) = self.lease_for(daemon, token)?;
        let owner_uid = holder.owner_uid;
        let on_root_exit = on_root_exit.unwrap_or_default();
        holder.grace_ms = u32::try_from(grace.as_millis()).unwrap_or(u32::MAX);
        if on_root_exit == RootExitPolicy::Keep {
            holder.flags |= holder_flags::KEEP_ON_ROOT_EXIT;
        }
        // The process itself, held by a pidfd from here on: everything below is checked on it
        // and done to it, whatever its pid comes to name later.
        let (process, pidfd) = identify(pid).map_err(|e| {
            let code = match e {
                IdentifyError::NotFound(_) | IdentifyError::Exiting(_) => ErrorCode::NotFound,
                IdentifyError::Thread { .. } => ErrorCode::BadRequest,
                IdentifyError::Io(..) => ErrorCode::Internal,
            };
            refuse(code, e.to_string())
        })?;
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
        if !may_signal(requester, target) || !may_signal(owner, target) {
            return Err(refuse(
                ErrorCode::PermissionDenied,
                format!(
                    "process {pid} belongs to uid {}; uid {} may not signal it",
                    target.real, self.peer.uid
                ),
            ));
        }
        // A tree registered with another lease's token counts against both uids.
        self.check_limits(daemon, owner_uid)?;
        if self.peer.uid != owner_uid {
            self.check_limits(daemon, self.peer.uid)?;
        }
        // What a process in a tree registers is nested in that tree (and a process that is in
        // a tree already stays in it: see Tracker::adopt_process).
        let nest_in = self.confinement(daemon).first().copied();
        let (tree, members, nested_in) = {
            let mut tracker = daemon.tracker();
            if tracker.trees().len() >= tracker.capacity().trees as usize {
                return Err(refuse(
                    ErrorCode::LimitReached,
                    "the daemon's tree capacity is full",
                ));
            }
            let tree = tracker
                .adopt_process(process, nest_in, holder)
                .map_err(|e| refuse(ErrorCode::NotFound, format!("{e:#}")))?;
            let status = tracker.tree_status(tree).ok();
            (
                tree,
                status.map_or(0, |s| s.members),
                status.and_then(|s| s.parent),
            )
        };
        let lease_alive = {
            let mut state = daemon.state();
            state.trees.insert(
                tree,
                TreeEntry {
                    lease,
                    owner_uid,
                    registrar_uid: self.peer.uid,
                    root: pid,
                    on_root_exit,
                    grace,
                    root_exited: false,
                    kill: None,
                    unkillable: false,
                },
            );
            state.leases.contains_key(&lease)
        };
        if !lease_alive {
            // The lease ended while the tree was being registered: it dies with its lease.
            enforcement::start_kill(daemon, tree, None, "lease_ended");
            return Err(refuse(ErrorCode::NotFound, "the lease ended"));
        }
        tracing::info!(
            tree,
            root = pid,
            lease,
            members,
            ?nested_in,
            "tree registered"
        );
        daemon.emit(owner_uid, enforcement::registered_event(tree, lease, pid));
        Ok(Reply::Registered {
            tree,
            root: pid,
            members,
        })
    }

    /// The tree the client's process runs in, then each tree that one is nested in; empty
    /// when it runs in none. The trees it may never release or kill.
    fn confinement(&self, daemon: &Daemon) -> Vec<TreeId> {
        let tracker = daemon.tracker();
        match tracker.member(self.peer.pid) {
            // The start time tells the client's process from an earlier one by the same pid;
            // unknown (0), the entry is taken as the client's: fail closed.
            Some(member)
                if self.peer.start_ticks == 0
                    || crate::proc::ns_to_ticks(member.start_ns) == self.peer.start_ticks =>
            {
                tracker.enclosing(member.tree)
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
        let Some((lease, owner)) = daemon
            .state()
            .trees
            .get(&tree)
            .map(|entry| (entry.lease, entry.owner_uid))
        else {
            return Err(not_found(tree));
        };
        let chain = daemon.tracker().enclosing(tree);
        let facts = TreeFacts {
            lease,
            owner,
            chain: &chain,
        };
        match rule(self.requester(&confined), facts) {
            Verdict::Allowed => Ok(()),
            Verdict::Hidden => Err(not_found(tree)),
            Verdict::Denied(why) => Err(refuse(
                ErrorCode::PermissionDenied,
                format!("tree {tree}: {why}"),
            )),
        }
    }

    /// The lease a new tree goes under, and who holds it: this connection's, or the one a
    /// token names.
    fn lease_for(
        &self,
        daemon: &Daemon,
        token: Option<&str>,
    ) -> Result<(LeaseId, Holder), Refusal> {
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
            ..Holder::default()
        };
        Ok((id, holder))
    }

    fn check_limits(&self, daemon: &Daemon, uid: u32) -> Result<(), Refusal> {
        if uid == 0 {
            return Ok(());
        }
        let held = daemon
            .state()
            .trees
            .values()
            .filter(|t| t.owner_uid == uid || t.registrar_uid == uid)
            .count();
        let limit = daemon.config.max_trees_per_uid;
        if held >= limit {
            return Err(refuse(
                ErrorCode::LimitReached,
                format!("uid {uid} holds {held} trees, the most allowed"),
            ));
        }
        Ok(())
    }

    fn release(&self, daemon: &Daemon, tree: TreeId) -> Result<Reply, Refusal> {
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
            .tracker()
            .release(tree)
            .map_err(|e| refuse(ErrorCode::Internal, format!("{e:#}")))?;
        tracing::info!(tree, "tree released");
        daemon.emit(
            entry.owner_uid,
            enforcement::released_event(tree, entry.lease),
        );
        Ok(Reply::Released { tree })
    }

    fn kill(
        &self,
        daemon: &Arc<Daemon>,
        id: u64,
        tree: TreeId,
        grace_ms: Option<u64>,
    ) -> Result<(), Refusal> {
        let grace = grace_ms.map(|ms| grace(daemon, Some(ms))).transpose()?;
        self.authorize(daemon, tree, may_kill)?;
        let pending = enforcement::start_kill(daemon, tree, grace, "request")
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
            outbox.reply(line);
        });
        Ok(())
    }

    fn list(&self, daemon: &Daemon) -> Reply {
        let confined = self.confinement(daemon);
        let who = self.requester(&confined);
        let chains: HashMap<TreeId, Vec<TreeId>> = {
            let trees: Vec<TreeId> = daemon.state().trees.keys().copied().collect();
            let tracker = daemon.tracker();
            trees
                .into_iter()
                .map(|tree| (tree, tracker.enclosing(tree)))
                .collect()
        };
        let visible: Vec<TreeInfo> = {
            let state = daemon.state();
            state
                .trees
                .iter()
                .filter_map(|(&tree, entry)| {
                    let chain = chains.get(&tree)?;
                    let facts = TreeFacts {
                        lease: entry.lease,
                        owner: entry.owner_uid,
                        chain,
                    };
                    may_see(who, facts).then_some((tree, entry, chain.get(1).copied()))
                })
                .map(|(tree, entry, nested_in)| TreeInfo {
                    tree,
                    lease: entry.lease,
                    owner_uid: entry.owner_uid,
                    root: entry.root,
                    on_root_exit: entry.on_root_exit,
                    grace_ms: u64::try_from(entry.grace.as_millis()).unwrap_or(u64::MAX),
                    host_pid: state.leases.get(&entry.lease).map_or(0, |l| l.host_pid),
                    host_comm: None,
                    root_exited: entry.root_exited,
                    state: match (&entry.kill, entry.unkillable) {
                        (Some(_), _) => "killing",
                        (None, true) => "unkillable",
                        (None, false) => "live",
                    }
                    .to_owned(),
                    nested_in,
                    members: Vec::new(),
                })
                .collect()
        };
        let tracker = daemon.tracker();
        let mut trees: Vec<TreeInfo> = visible
            .into_iter()
            .map(|mut info| {
                info.host_comm = crate::proc::process(info.host_pid).map(|p| p.comm);
                let mut members = tracker.members(info.tree).unwrap_or_default();
                crate::kernel::fill_comms(&mut members);
                info.members = members
                    .into_iter()
                    .map(|m| MemberInfo {
                        pid: m.pid,
                        parent: m.parent,
                        start_ns: m.start_ns,
                        comm: m.comm,
                    })
                    .collect();
                info
            })
            .collect();
        trees.sort_by_key(|t| t.tree);
        Reply::Trees(trees)
    }

    fn subscribe(&mut self, daemon: &Daemon) -> Reply {
        if self.subscribed {
            return Reply::Subscribed;
        }
        self.subscribed = true;
        let mut events = daemon.events.subscribe();
        let outbox = self.outbox.clone();
        let mut closing = self.closing.clone();
        let uid = self.peer.uid;
        // A process in a tree hears only of its own lease's trees; any other, of its uid's.
        let own_lease = (!self.confinement(daemon).is_empty()).then_some(self.peer.lease);
        let may_hear = move |owner: u32, event: &leash_client::Event| match own_lease {
            Some(lease) => event.lease == lease,
            None => may_manage(uid, owner),
        };
        tokio::spawn(async move {
            // Events this subscriber missed and has not been told about yet.
            let mut missed = 0;
            loop {
                let event = tokio::select! {
                    // The count goes out as soon as there is room for it, even if no other
                    // event ever comes (the end of a storm): it is never left untold.
                    room = outbox.event_room(), if missed > 0 => {
                        let Some(room) = room else { break };
                        let mut dropped = enforcement::event(EventKind::Dropped, 0, 0, None);
                        dropped.count = Some(missed);
                        room.send(ServerLine::event(dropped));
                        missed = 0;
                        continue;
                    }
                    received = events.recv() => match received {
                        Ok((owner, event)) if may_hear(owner, &event) => event,
                        Ok(_) => continue,
                        Err(RecvError::Lagged(n)) => {
                            missed += n;
                            continue;
                        }
                        Err(RecvError::Closed) => break,
                    },
                    _ = closing.changed() => break,
                };
                if missed > 0 {
                    let mut dropped = enforcement::event(EventKind::Dropped, 0, 0, None);
                    dropped.count = Some(missed);
                    match outbox.event(ServerLine::event(dropped)) {
                        Ok(()) => missed = 0,
                        Err(Undelivered::Full) => {
                            missed += 1;
                            continue;
                        }
                        Err(Undelivered::Closed) => break,
                    }
                }
                match outbox.event(ServerLine::event(event)) {
                    Ok(()) => {}
                    Err(Undelivered::Full) => missed += 1,
                    Err(Undelivered::Closed) => break,
                }
            }
        });
        Reply::Subscribed
    }
}

impl Session {
    fn status(&self, daemon: &Daemon) -> Result<Reply, Refusal> {
        let (trees, leases) = {
            let state = daemon.state();
            let leases = state
                .leases
                .values()
                .filter(|lease| may_manage(self.peer.uid, lease.uid))
                .count();
            (state.trees.len(), leases)
        };
        let tracker = daemon.tracker();
        let internal = |e: anyhow::Error| refuse(ErrorCode::Internal, format!("{e:#}"));
        let stats = tracker.stats().map_err(internal)?;
        let members = tracker.member_counts().map_err(internal)?.values().sum();
        let capacity = tracker.capacity();
        Ok(Reply::Status(StatusInfo {
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: PROTOCOL_VERSION,
            programs: crate::kernel::PROGRAMS_ATTACHED
                .iter()
                .map(|(name, at)| format!("{name} ({at})"))
                .collect(),
            member_capacity: capacity.members,
            members,
            tree_capacity: capacity.trees,
            trees: trees as u64,
            leases: leases as u64,
            events_dropped: stats.events_dropped,
            inserts_failed: stats.inserts_failed,
            pinned_at: tracker.pin_dir().map(|dir| dir.display().to_string()),
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
