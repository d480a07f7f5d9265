//! What each request does, as a value the connection acts on: a reply now, a reply later, a
//! subscription, a pause, or an event. A request that is malformed, not allowed or impossible
//! gets an error reply and changes nothing; one that another process than the lease's host
//! sent gets no reply (its id is not the host's), and the host is told by a `refused` event.

pub(super) mod listing;
pub(super) mod process_figures;
pub(super) mod registration;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use leash_client::protocol::{
    DecodeError, ErrorCode, Event, EventKind, KillReason, LeaseInfo, Op, PROTOCOL_VERSION, Reply,
    Request, ServerLine, TreeId, decode_request,
};

use registration::{Asked, Naming};

use crate::{
    daemon::{
        enforce::enforcement,
        io::request_stream::{Pidfds, Strangers},
        rules::{
            auth::{Requester, TreeFacts, Verdict, may_kill, may_release, may_see},
            limits::describe,
            peer::Peer,
            refusal::Refusal,
        },
        state::{shared::Daemon, subscribers::Hears},
    },
    kernel::KillError,
};

/// What a request costs of its uid's budget (see `limits`): most are map lookups; these read
/// /proc or walk the member map.
const HEAVY_COST: u32 = 20;

/// A reply that comes once something is done (a kill's, when its tree is empty).
pub(super) type LaterReply = Pin<Box<dyn Future<Output = ServerLine> + Send>>;

/// What the connection does with a request.
pub(super) enum Response {
    /// Sends this line.
    Now(ServerLine),
    /// Sends what this gives, when it gives it, serving other requests meanwhile.
    Later(LaterReply),
    /// From now on its outbox hears what `Hears` lets through; then it sends this line.
    Subscribe(Hears, ServerLine),
    /// The client is over its uid's request rate: sends this line, and reads nothing more from
    /// it for this long.
    Pause(ServerLine, Duration),
    /// Sends this event (its pids numbered for the client), subscribed or not; then pauses,
    /// if given, as [`Response::Pause`] does.
    Event(Event, Option<Duration>),
}

/// One connection's side of request handling.
pub(super) struct Session {
    pub peer: Peer,
    pub subscribed: bool,
    /// The pidfds this connection sent, for the requests that name their process by one.
    pub pidfds: Pidfds,
    /// The lines that a process other than the host sent on this connection.
    pub strangers: Strangers,
}

/// The op's word, for the log.
fn op_name(op: &Op) -> &'static str {
    match op {
        Op::Hello { .. } => "hello",
        Op::Register { .. } => "register",
        Op::Release { .. } => "release",
        Op::Kill { .. } => "kill",
        Op::List { .. } => "list",
        Op::Subscribe => "subscribe",
        Op::Status => "status",
    }
}

/// The tree a request names, if it names one.
fn op_tree(op: &Op) -> Option<TreeId> {
    match op {
        Op::Release { tree } | Op::Kill { tree, .. } => Some(*tree),
        Op::List { tree, .. } => *tree,
        _ => None,
    }
}

/// An answer to a request: a reply, or a refusal.
type Answer = Result<Reply, Refusal>;

impl Session {
    /// Handles request line `line_number` of the connection.
    pub(super) async fn handle(
        &mut self,
        daemon: &Arc<Daemon>,
        line: &[u8],
        line_number: u64,
    ) -> Response {
        let account = self.peer.account;
        // A lease is its host's: a request another process sent on its connection (a socket
        // leaked to a child, or taken from the host) is refused, and the lease goes on. Well
        // formed or not, it is not answered: a reply would carry an id the host never sent.
        if let Some(event) = self.refuse_stranger(line_number, ErrorCode::PermissionDenied, line) {
            return Response::Event(event, daemon.limits.spend(account, 1).err());
        }
        let Request { id, op } = match decode_request(line) {
            Ok(request) => request,
            Err(DecodeError { id, message }) => {
                // Debug only: a flood of bad lines must not flood the log (it is rate-limited
                // anyway).
                tracing::debug!(id, message, "bad request");
                let error = ServerLine::error(id, ErrorCode::BadRequest, message);
                return paced(error, daemon.limits.spend(account, 1));
            }
        };
        let cost = match op {
            Op::Register { .. } | Op::List { .. } => HEAVY_COST,
            _ => 1,
        };
        if let Err(pause) = daemon.limits.spend(account, cost) {
            let limits = daemon.limits.limits();
            let error = ServerLine::error(
                Some(id),
                ErrorCode::LimitReached,
                format!(
                    "{} is over its {} requests a second (list and register count {HEAVY_COST}); \
                     retry in {} ms",
                    describe(account),
                    limits.requests_per_second,
                    pause.as_millis().max(1)
                ),
            );
            return Response::Pause(error, pause);
        }
        tracing::debug!(id, op = op_name(&op), tree = op_tree(&op), "request");
        let tree = op_tree(&op);
        let answer = match op {
            Op::Hello { protocol } => self.hello(daemon, protocol),
            Op::Register {
                pid,
                pidfd,
                lease,
                on_root_exit,
                grace_ms,
            } => {
                let peer = &self.peer;
                let asked = Asked {
                    token: lease.as_deref(),
                    on_root_exit,
                    grace_ms,
                };
                let naming = Naming {
                    pid,
                    pidfd,
                    line_number,
                };
                match registration::named(peer, &self.pidfds, naming, &asked) {
                    Ok(named) => registration::register(daemon, peer, named, asked).await,
                    Err(refusal) => Err(refusal),
                }
            }
            Op::Release { tree } => self.release(daemon, tree).await,
            Op::Kill { tree, grace_ms } => match self.kill(daemon, id, tree, grace_ms).await {
                Ok(later) => return Response::Later(later),
                Err(refusal) => Err(refusal),
            },
            Op::List { tree, leases } => listing::list(daemon, &self.peer, tree, leases).await,
            Op::Subscribe => return self.subscribe(daemon, id),
            Op::Status => listing::status(daemon, &self.peer),
        };
        Response::Now(match answer {
            Ok(reply) => ServerLine::ok(id, reply),
            Err(refusal) => self.refused(id, tree, refusal),
        })
    }

    /// If a process other than the host sent (part of) line `line_number`, `line`, its
    /// `refused` event for the host, with `code`: logged at INFO (`request_refused`, with the
    /// `sender`), as any refusal is.
    pub(super) fn refuse_stranger(
        &self,
        line_number: u64,
        code: ErrorCode,
        line: &[u8],
    ) -> Option<Event> {
        let sender = self.strangers.sender_of(line_number)?;
        // What it asked, for the log, if it can be told.
        let request = decode_request(line).ok();
        tracing::info!(
            parent: None,
            event = "request_refused",
            request = request.as_ref().map(|r| r.id),
            tree = request.as_ref().and_then(|r| op_tree(&r.op)),
            lease = self.peer.lease,
            host_pid = self.peer.process.pid,
            uid = self.peer.uid,
            sender,
            code = %code,
            reason = "sent by another process than the lease's host: a lease serves its host \
                      alone",
            "request refused"
        );
        // The daemon's number for the sender: the connection gives the host its own.
        Some(Event::refused(self.peer.lease, sender, code, line))
    }

    /// The INFO line of a request refused (`request_refused`): what was asked (and of which
    /// tree), the refusal's code, and why; returns its error reply. A line that is no request,
    /// and a request over its uid's rate, are not logged one by one: a client in a loop must
    /// not fill the log.
    fn refused(&self, request: u64, tree: Option<TreeId>, refusal: Refusal) -> ServerLine {
        tracing::info!(
            parent: None,
            event = "request_refused",
            request,
            tree,
            lease = self.peer.lease,
            host_pid = self.peer.process.pid,
            uid = self.peer.uid,
            code = %refusal.code,
            reason = refusal.message.as_str(),
            "request refused"
        );
        refusal.into_line(request)
    }

    fn hello(&self, daemon: &Daemon, protocol: u32) -> Answer {
        if protocol != PROTOCOL_VERSION {
            return Err(Refusal::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "this daemon (leash {}) speaks protocol {PROTOCOL_VERSION}, not {protocol}",
                    env!("CARGO_PKG_VERSION")
                ),
            ));
        }
        let token = daemon
            .registry
            .token(self.peer.lease)
            .ok_or_else(|| Refusal::new(ErrorCode::Internal, "this connection has no lease"))?;
        Ok(Reply::Hello {
            protocol: PROTOCOL_VERSION,
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            lease: LeaseInfo {
                id: self.peer.lease,
                token,
            },
        })
    }

    async fn release(&self, daemon: &Daemon, tree: TreeId) -> Answer {
        self.authorize(daemon, tree, may_release)?;
        let entry = daemon
            .registry
            .take_for_release(tree)
            .map_err(|state| match state {
                None => Refusal::no_tree(tree),
                Some(_) => Refusal::new(
                    ErrorCode::BadRequest,
                    format!("tree {tree} is being killed"),
                ),
            })?;
        daemon
            .jobs
            .release(tree)
            .await?
            .map_err(|e| Refusal::new(ErrorCode::Internal, e.with_causes()))?;
        tracing::info!(tree, "tree released");
        let released = Event::new(EventKind::Released, tree, entry.lease, None);
        daemon.emit(&entry.audience(), released);
        Ok(Reply::Released { tree })
    }

    /// Starts the kill; its reply comes when the tree is empty, while the connection goes on
    /// serving.
    async fn kill(
        &self,
        daemon: &Daemon,
        id: u64,
        tree: TreeId,
        grace_ms: Option<u64>,
    ) -> Result<LaterReply, Refusal> {
        let grace = grace_ms
            .map(|ms| registration::grace(daemon, Some(ms)))
            .transpose()?;
        self.authorize(daemon, tree, may_kill)
            .map_err(|refusal| match refusal.code {
                ErrorCode::NotFound => self.no_tree_to_kill(daemon, tree),
                _ => refusal,
            })?;
        let pending = daemon
            .jobs
            .kill(tree, grace, KillReason::Request)
            .await?
            .ok_or_else(|| self.no_tree_to_kill(daemon, tree))?;
        Ok(Box::pin(async move {
            match enforcement::outcome(pending).await {
                Ok(summary) => ServerLine::ok(id, Reply::Killed(summary)),
                Err(e @ KillError::Unkillable { .. }) => {
                    ServerLine::error(Some(id), ErrorCode::KillFailed, e.to_string())
                }
                Err(e) => ServerLine::error(Some(id), ErrorCode::Internal, e.to_string()),
            }
        }))
    }

    /// `no tree N`; and when N is the pid of a member of a tree the client may see, which
    /// tree to kill instead: a pid is the number a user has at hand (from ps, top, a log).
    fn no_tree_to_kill(&self, daemon: &Daemon, number: TreeId) -> Refusal {
        match self.visible_tree_of(daemon, number) {
            Some(tree) => Refusal::new(
                ErrorCode::NotFound,
                format!(
                    "no tree {number}; process {number} is a member of tree {tree}: \
                     leash kill {tree}"
                ),
            ),
            None => Refusal::no_tree(number),
        }
    }

    /// The tree process `pid` is a member of, if the client may see that tree. The member
    /// map numbers processes in the daemon's pid namespace: a client in another one is not
    /// told (its number names another process there).
    fn visible_tree_of(&self, daemon: &Daemon, pid: u32) -> Option<TreeId> {
        if !self.peer.numbering.is_daemons() {
            return None;
        }
        let tree = daemon.view.member(pid)?.tree;
        let ownership = daemon.registry.ownership(tree)?;
        let confined = self.peer.confinement(&daemon.view);
        let chain = daemon.view.enclosing(tree);
        may_see(self.peer.requester(&confined), ownership.facts(&chain)).then_some(tree)
    }

    fn subscribe(&mut self, daemon: &Daemon, id: u64) -> Response {
        let reply = ServerLine::ok(id, Reply::Subscribed);
        if self.subscribed {
            return Response::Now(reply);
        }
        self.subscribed = true;
        // A process in a tree hears only of its own lease's trees; any other, of its uid's.
        let hears = if !self.peer.confinement(&daemon.view).is_empty() {
            Hears::Lease(self.peer.lease)
        } else if self.peer.uid == 0 {
            Hears::Everything
        } else {
            Hears::Uid(self.peer.uid)
        };
        Response::Subscribe(hears, reply)
    }

    /// The verdict of `rule` on `tree`, as a refusal if it is not allowed.
    fn authorize(
        &self,
        daemon: &Daemon,
        tree: TreeId,
        rule: fn(Requester<'_>, TreeFacts<'_>) -> Verdict,
    ) -> Result<(), Refusal> {
        let confined = self.peer.confinement(&daemon.view);
        let Some(ownership) = daemon.registry.ownership(tree) else {
            return Err(Refusal::no_tree(tree));
        };
        let chain = daemon.view.enclosing(tree);
        match rule(self.peer.requester(&confined), ownership.facts(&chain)) {
            Verdict::Allowed => Ok(()),
            Verdict::Hidden => Err(Refusal::no_tree(tree)),
            Verdict::Denied(why) => Err(Refusal::new(
                ErrorCode::PermissionDenied,
                format!("tree {tree}: uid {} is refused: {why}", self.peer.uid),
            )),
        }
    }
}

/// `line` now, with a pause after it if the uid went over its request rate by this request.
fn paced(line: ServerLine, spent: Result<(), Duration>) -> Response {
    match spent {
        Ok(()) => Response::Now(line),
        Err(pause) => Response::Pause(line, pause),
    }
}
