//! `leash daemon`: the privileged service. It loads the programs, serves the protocol on a Unix
//! socket, holds one lease per connection, and kills trees when their root exits, their host
//! dies, or someone with the right asks.
//!
//! - [`owner`]: the thread that owns the tracker and runs enforcement, ahead of clients.
//! - [`enforcement`]: the kill driver, root-exit detection, lease ends, shutdown.
//! - [`accept`]: accepting connections, backing off when descriptors run out.
//! - [`connection`]: one task per client: bounded lines in, replies and events out, the lease.
//! - [`disposal`]: closing what clients sent on threads of its own, bounded per uid.
//! - [`requests`]: what each request does.
//! - [`outbox`]: a connection's replies and events, bounded in bytes.
//! - [`subscribers`]: who hears of which events.
//! - [`identity`]: who a client is beyond its uid: its account, its pid namespaces.
//! - [`limits`]: per-account caps on connections, request rate and heavy work.
//! - [`auth`]: the kill(2) rule and tree ownership.
//! - [`metrics`], [`metrics_http`]: the figures for Prometheus (`--metrics`).

mod accept;
mod auth;
mod connection;
mod disposal;
mod enforcement;
mod identity;
mod limits;
mod metrics;
mod metrics_http;
mod outbox;
mod owner;
mod pid_view;
mod recover;
mod request_stream;
mod requests;
mod subscribers;

pub use limits::UidLimits;
pub use metrics_http::MetricsAddr;

use std::{
    collections::HashMap,
    fs, io,
    os::{fd::AsFd, unix::fs::FileTypeExt},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};
use leash_client::protocol::{Event, KillSummary, LeaseId, RootExitPolicy, TreeId};
use leash_common::Account;
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
    sync::{oneshot, watch},
};

use subscribers::Audience;

use crate::{
    kernel::{Capacity, KillError, Origin, Tracker, TrackerView, Whois},
    sys, trusted_dir,
};

/// How the daemon runs.
#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    pub capacity: Capacity,
    /// Grace period of trees that do not set one.
    pub default_grace: Duration,
    /// Trees a non-root uid may hold at once.
    pub max_trees_per_uid: usize,
    /// Connections and request rate a non-root uid may have.
    pub uid_limits: UidLimits,
    /// Where the programs and maps are pinned (a directory on bpffs), so that tracking goes on
    /// while the daemon is away and the next one takes over. None: not pinned.
    pub pin_root: Option<PathBuf>,
    /// Where the metrics are served, if anywhere.
    pub metrics: Option<MetricsAddr>,
    /// The group that may connect to a metrics Unix socket, besides root.
    pub metrics_group: Option<u32>,
}

/// The outcome of a kill, as every waiter sees it.
pub type KillOutcome = Result<KillSummary, KillError>;

/// A kill under way.
#[derive(Debug)]
struct PendingKill {
    outcome: watch::Receiver<Option<KillOutcome>>,
    /// The grace period, which a later kill, the lease's end or shutdown may shorten (never
    /// lengthen); the kill task follows it.
    grace: watch::Sender<Duration>,
}

/// What the daemon knows about a registered tree, beyond the kernel maps.
#[derive(Debug)]
struct TreeEntry {
    lease: LeaseId,
    owner_uid: u32,
    /// The pid of the lease's host (0 if no daemon recorded one): named in the tree's log lines,
    /// which may come after the lease has ended.
    host_pid: u32,
    /// The lease's account, and the account of the client that asked for it (the same, or
    /// another's that used the lease's token): both count it against their limits.
    account: Account,
    registrar_account: Account,
    /// The pid namespaces of the lease's host, its own first: clients in these see the tree.
    registered_from: Arc<[u32]>,
    /// The root's number in each pid namespace it is in, the daemon's first (`NSpid`): how
    /// clients in containers are told it, even once it has exited.
    root: Box<[u32]>,
    on_root_exit: RootExitPolicy,
    grace: Duration,
    root_exited: bool,
    /// Set once a kill has started: every later kill request waits on the same one.
    kill: Option<PendingKill>,
    /// The last kill gave up on members stuck in the kernel (the tree stays doomed).
    unkillable: bool,
}

#[derive(Debug)]
struct Lease {
    token: String,
    uid: u32,
    account: Account,
    /// The host's pid namespaces, its own first.
    pid_namespaces: Arc<[u32]>,
    host_pid: u32,
    /// The host's start time in /proc's clock ticks (with the pid, it names the host).
    host_start_ticks: u64,
    /// A tree was registered under it: from then on its end is worth an INFO line.
    held_trees: bool,
}

#[derive(Debug, Default)]
struct State {
    trees: HashMap<TreeId, TreeEntry>,
    leases: HashMap<LeaseId, Lease>,
    next_lease: LeaseId,
}

/// Shared by every task of the daemon. The tracker itself is the owner thread's alone (see
/// [`owner`]); everyone else reads the maps through `view` and hands changes to `jobs`.
pub struct Daemon {
    view: TrackerView,
    jobs: owner::Jobs,
    /// Held only for short, bounded work.
    state: Mutex<State>,
    subscribers: subscribers::Subscribers,
    limits: Arc<limits::Limits>,
    /// Where the pins are, if pinned.
    pinned_at: Option<PathBuf>,
    /// The ptrace guard in place, for `status`.
    ptrace_guard: crate::kernel::Guard,
    /// Set when a connection ends or heavy work is done: the allocator's free memory is then
    /// given back.
    memory_freed: AtomicBool,
    /// Connections that could not be set up, for a log line at most every 10 s.
    setup_failures: Mutex<accept::RateLimit>,
    /// What happened, counted for `--metrics`.
    metrics: Arc<metrics::Metrics>,
    /// Where what clients sent is closed, and their connections' sockets.
    disposal: disposal::Disposal,
    /// What the kernel knows of clients that /proc does not tell; asked one at a time.
    whois: Arc<Whois>,
    whois_turn: tokio::sync::Semaphore,
    /// The daemon's own pid namespace (inode number).
    pid_namespace: u32,
    config: Config,
}

impl Daemon {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a bug; the plain data it guards is still
        // consistent (every update is one map operation), so go on with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a lease for the host `host_pid` (started at `host_start_ticks`) of uid `uid`, who
    /// is `who`, with a new secret token.
    fn open_lease(
        &self,
        uid: u32,
        who: &identity::ClientIdentity,
        host_pid: u32,
        host_start_ticks: u64,
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
                account: who.account,
                pid_namespaces: who.pid_namespaces.clone(),
                host_pid,
                host_start_ticks,
                held_trees: false,
            },
        );
        Ok(id)
    }

    /// Notes that `lease` now holds a tree; at its first, says so at INFO (`lease_opened`). A
    /// connection that only asks (`status`, `list`, `watch`) is logged at DEBUG alone: a client
    /// that connects in a loop must not fill the log.
    fn lease_holds_a_tree(&self, lease: LeaseId) {
        let first = {
            let mut state = self.state();
            let Some(entry) = state.leases.get_mut(&lease) else {
                return;
            };
            let first = !entry.held_trees;
            entry.held_trees = true;
            first.then_some((entry.uid, entry.host_pid))
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

    /// Takes `lease` out (its trees are the caller's to kill) and logs its end, `reason`: at
    /// INFO (`lease_ended`) if it ever held a tree, at DEBUG if it only asked. Once: when both
    /// the connection and the watch on its host see the host die, the second finds it gone.
    fn remove_lease(&self, lease: LeaseId, reason: &str) {
        let Some(entry) = self.state().leases.remove(&lease) else {
            return;
        };
        if entry.held_trees {
            tracing::info!(
                parent: None,
                event = "lease_ended",
                lease,
                host_pid = entry.host_pid,
                uid = entry.uid,
                reason,
                "lease ended"
            );
        } else {
            tracing::debug!(lease, reason, "lease ended");
        }
    }

    /// Sends an event of a tree to the subscribers of its `audience`.
    fn emit(&self, audience: &Audience, event: Event) {
        self.subscribers.deliver(audience, event, None);
    }

    /// Sends an event about a tree's root, whose numbers in each pid namespace are
    /// `root_numbers`: subscribers in containers are told its number there even once it is gone.
    fn emit_about_root(&self, audience: &Audience, event: Event, root_numbers: &[u32]) {
        self.subscribers
            .deliver(audience, event, Some(root_numbers));
    }
}

impl TreeEntry {
    /// Who may hear of the tree's events.
    fn audience(&self) -> Audience {
        Audience {
            owner: self.owner_uid,
            registered_from: self.registered_from.clone(),
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT, then kills every live tree and removes the socket and
/// the pins; or, pinned, until SIGHUP, then exits leaving every tree tracked in the pins for the
/// next daemon (a hand-over, to upgrade or restart without killing anything).
pub async fn run(config: Config) -> Result<()> {
    // Before anything else: a signal that came before its handler would end the daemon the
    // default way, skipping both the shutdown and the hand-over.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut hangup = signal(SignalKind::hangup())?;
    // The socket first: it refuses to start beside a live daemon, which holds the pins.
    let listener = bind(&config.socket, "--socket", SocketAccess::Everyone)?;
    // Connections inherit it (at connect on recent kernels, at accept on older ones): the
    // kernel names the sender of all they carry (see request_stream); each is set again as it
    // is served.
    if let Err(e) = sys::set_passcred(listener.as_fd()) {
        tracing::warn!("SO_PASSCRED on the listening socket: {e}");
    }
    // Before the programs load too: an endpoint that is taken is refused at once.
    let metrics_listener = match &config.metrics {
        Some(addr) => Some(
            metrics_http::bind(addr, config.metrics_group)
                .await
                .inspect_err(|_| {
                    let _ = fs::remove_file(&config.socket);
                })?,
        ),
        None => None,
    };
    let loaded = match &config.pin_root {
        Some(root) => Tracker::load_pinned(config.capacity, root),
        None => Tracker::load(config.capacity).map(|tracker| (tracker, Origin::Loaded)),
    };
    let (tracker, origin) = loaded.inspect_err(|_| remove_sockets(&config))?;
    tracing::info!(
        socket = %config.socket.display(),
        capacity = ?tracker.capacity(),
        pins = ?tracker.pin_dir(),
        limits = ?config.uid_limits,
        "leash daemon serving"
    );
    let view = tracker
        .shared_view()
        .inspect_err(|_| remove_sockets(&config))?;
    let pid_namespace = crate::proc::own_pid_namespace()
        .context("reading the daemon's pid namespace")
        .inspect_err(|_| remove_sockets(&config))?;
    let (jobs, queues) = owner::queues();
    let daemon = Arc::new(Daemon {
        view,
        jobs,
        state: Mutex::new(State {
            next_lease: 1,
            ..State::default()
        }),
        subscribers: Default::default(),
        limits: limits::Limits::new(config.uid_limits),
        pinned_at: tracker.pin_dir().map(Path::to_path_buf),
        ptrace_guard: tracker.ptrace_guard(),
        memory_freed: AtomicBool::new(false),
        setup_failures: Mutex::default(),
        metrics: Arc::default(),
        disposal: disposal::Disposal::default(),
        whois: tracker.whois(),
        whois_turn: tokio::sync::Semaphore::new(1),
        pid_namespace,
        config,
    });
    owner::start(daemon.clone(), tracker, queues, origin == Origin::TakenOver)
        .context("starting the enforcement thread")?;
    tokio::spawn(release_free_memory(daemon.clone()));
    if let Some(listener) = metrics_listener {
        tracing::info!("metrics served on {listener}");
        tokio::spawn(metrics_http::serve(listener, daemon.clone()));
    }

    let mut accept_failures = accept::AcceptFailures::default();
    loop {
        tokio::select! {
            stream = accept::next_connection(&listener, &mut accept_failures) => {
                tokio::spawn(connection::serve(daemon.clone(), stream));
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = hangup.recv() => {
                if daemon.pinned_at.is_some() {
                    tracing::info!(
                        "handing over: exiting with every tree tracked in the pins; the next \
                         daemon takes them over"
                    );
                    close_listener(&daemon, listener);
                    remove_sockets(&daemon.config);
                    return Ok(());
                }
                tracing::warn!("SIGHUP ignored: not pinned, so nothing could take over");
            }
        }
    }
    tracing::info!("shutting down: killing every live tree");
    close_listener(&daemon, listener);
    remove_sockets(&daemon.config);
    let (stopped, stopping) = oneshot::channel();
    daemon.jobs.urgent(|owner| {
        let owner = owner.clone();
        tokio::task::spawn_local(async move {
            enforcement::kill_all(&owner, "shutdown").await;
            // Nothing is left to track: the next daemon starts afresh.
            if let Err(e) = owner.tracker().unpin() {
                tracing::warn!("removing the pins: {e:#}");
            }
            let _ = stopped.send(());
        });
    });
    let _ = stopping.await;
    tracing::info!("stopped");
    Ok(())
}

/// Closes the listener apart (`disposal`): the connections it has not accepted yet go with it,
/// and what their clients queued on them, whose close may block. Here, it would hold up the
/// kill of every tree that follows.
fn close_listener(daemon: &Daemon, listener: UnixListener) {
    match listener.into_std() {
        Ok(listener) => daemon.disposal.close_listener(listener.into()),
        // It could not be taken from tokio, and was closed there.
        Err(e) => tracing::warn!("closing the listener: {e}"),
    }
}

/// How often the allocator's free memory is given back, at most (and only after a connection
/// ended or heavy work was done: a flood's buffers are freed when its connections close, an
/// adoption's /proc snapshots when it ends).
const RELEASE_MEMORY_EVERY: Duration = Duration::from_secs(2);

async fn release_free_memory(daemon: Arc<Daemon>) {
    let mut every = tokio::time::interval(RELEASE_MEMORY_EVERY);
    loop {
        every.tick().await;
        if daemon.memory_freed.swap(false, Ordering::Relaxed) {
            tokio::task::spawn_blocking(sys::release_free_memory);
        }
    }
}

/// A lease's secret, which lets the `leash exec` shim join it: 128 random bits, in hex.
fn new_token() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    sys::random_bytes(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes the daemon's sockets (it is stopping, or could not start).
fn remove_sockets(config: &Config) {
    let _ = fs::remove_file(&config.socket);
    if let Some(path) = config.metrics.as_ref().and_then(MetricsAddr::socket_path) {
        let _ = fs::remove_file(path);
    }
}

/// Who may connect to a socket the daemon binds, by its file's mode.
#[derive(Clone, Copy, Debug)]
enum SocketAccess {
    /// 0666: anyone; what they may do is checked per request.
    Everyone,
    /// 0600, root's alone; 0660 with its group set to this one, if given.
    Root { group: Option<u32> },
}

/// Binds a socket, the one `option` names: its directory is made if needed (0755) and must be
/// root's alone (see `trusted_dir`), a stale socket is replaced, a live daemon's is not.
fn bind(path: &Path, option: &str, access: SocketAccess) -> Result<UnixListener> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    trusted_dir::ensure(dir, 0o755, option)?;
    remove_stale(path, option)?;
    // The socket is made with its mode (0777 less the mask), so its mode is never set by path
    // after it is visible, which would follow whatever the path names by then. Nothing else
    // makes files now: the daemon binds before it starts any task.
    let mask = match access {
        SocketAccess::Everyone => 0o111,
        SocketAccess::Root { group: None } => 0o177,
        SocketAccess::Root { group: Some(_) } => 0o117,
    };
    let umask = sys::umask(mask);
    let bound = UnixListener::bind(path);
    sys::umask(umask);
    let listener = bound.with_context(|| format!("binding {}", path.display()))?;
    if let SocketAccess::Root { group: Some(gid) } = access {
        // Until now the socket is 0660 root:root: no one but root could connect. The directory
        // is root's alone (checked above), so the path still names the socket just made, and
        // lchown would not follow a symlink anyway. Without CAP_CHOWN (the unit and the pod
        // bound it out), a file's owner may give it only to a group it is in.
        std::os::unix::fs::lchown(path, None, Some(gid))
            .inspect_err(|_| {
                let _ = fs::remove_file(path);
            })
            .with_context(|| {
                format!(
                    "giving {} to group {gid} (the daemon must be in the group, e.g. \
                     SupplementaryGroups= in its unit, supplementalGroups in its pod, or have \
                     CAP_CHOWN)",
                    path.display()
                )
            })?;
    }
    Ok(listener)
}

/// Removes a socket left by a daemon that died. Anything else at `path` (a file, a symlink)
/// is not the daemon's to remove.
fn remove_stale(path: &Path, option: &str) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        meta => meta.with_context(|| format!("checking {}", path.display()))?,
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket: the daemon replaces only a stale socket; remove it \
             if it is not needed, or choose another {option}",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another leash daemon is serving {} (choose another {option}, or stop that daemon)",
            path.display()
        );
    }
    fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
