//! `leash daemon`: the privileged service. It loads the programs, serves the protocol on a Unix
//! socket, holds one lease per connection, and kills trees when their root exits, their host
//! dies, or someone with the right asks.
//!
//! Its files are in folders, one per floor. Each folder imports only from the folders below it,
//! and each file only from files below it (`cargo xtask lint` checks both), from the bottom:
//!
//! - [`rules`] and [`metrics`]: what the daemon is told and who a client is to the rules; the
//!   rules themselves (the kill(2) rule, tree ownership, per-account caps, why leases end, the
//!   error reply); the figures for Prometheus.
//! - [`io`]: bytes and descriptors in and out. Accepting connections and their per-uid places
//!   while they are set up; bounded lines in, with the descriptors clients send, emptied and
//!   closed on threads of their own; a connection's replies and events out, bounded in bytes;
//!   the word to every connection that the daemon stops.
//! - [`state`]: the leases and trees, who hears of which events, who a client is beyond its
//!   uid, what every task shares, and what the rest of the daemon asks of the owner thread.
//! - [`enforce`]: what runs on the owner thread: the ring buffer's records, the kill of a tree,
//!   when trees are killed, adoptions in short steps, the take-over of a previous daemon's
//!   trees, and the thread itself.
//! - [`requests`]: what each request does, as a value (registering and listing among them).
//! - [`serve`]: setting up each connection, serving its lease, and the metrics endpoint.

mod enforce;
mod io;
mod metrics;
mod requests;
mod rules;
mod serve;
mod state;

pub use rules::{
    config::{Config, MetricsAddr},
    limits::UidLimits,
};

use std::{fs, os::fd::AsFd, path::Path, sync::Arc, time::Duration};

use leash_client::protocol::ClosingReason;

use anyhow::{Context, Result};
use tokio::{
    net::UnixListener,
    signal::unix::{SignalKind, signal},
};

use self::{
    io::socket::{SocketAccess, bind, remove_sockets},
    state::shared::Daemon,
};
use crate::{
    kernel::{Origin, Tracker},
    sys,
};

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
            serve::metrics_http::bind(addr, config.metrics_group)
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
    // Loading parsed the kernel's BTF (for the offsets, then again for aya's relocations) and
    // the programs' object: some 40 MiB, all freed by now, but held by the allocator until it
    // is asked to give them back. Asked now, before anything is served, the daemon starts at
    // the size it keeps.
    sys::release_free_memory();
    let capacity = tracker.capacity();
    tracing::info!(
        socket = %config.socket.display(),
        max_members = capacity.members,
        max_trees = capacity.trees,
        max_members_per_uid = capacity.members_per_uid,
        pins = tracker
            .pin_dir()
            .map(|dir| tracing::field::display(dir.display())),
        max_connections_per_uid = config.uid_limits.connections,
        requests_per_second_per_uid = config.uid_limits.requests_per_second,
        "leash daemon serving"
    );
    let view = tracker
        .shared_view()
        .inspect_err(|_| remove_sockets(&config))?;
    let pid_namespace = crate::proc::own_pid_namespace()
        .context("reading the daemon's pid namespace")
        .inspect_err(|_| remove_sockets(&config))?;
    let (jobs, queues) = state::commands::queues();
    let daemon = Arc::new(Daemon::new(
        config,
        view,
        jobs,
        tracker.pin_dir().map(Path::to_path_buf),
        (tracker.programs(), tracker.membership()),
        (tracker.whois(), tracker.descent()),
        pid_namespace,
    ));
    enforce::owner_thread::start(daemon.clone(), tracker, queues, origin == Origin::TakenOver)
        .context("starting the enforcement thread")?;
    tokio::spawn(release_free_memory(daemon.clone()));
    if let Some(listener) = metrics_listener {
        tracing::info!("metrics served on {listener}");
        tokio::spawn(serve::metrics_http::serve(listener, daemon.clone()));
    }

    let mut accept_failures = io::accept::AcceptFailures::default();
    loop {
        tokio::select! {
            (stream, place) = serve::connection::next_admitted(&daemon, &listener, &mut accept_failures) => {
                tokio::spawn(serve::connection::serve(daemon.clone(), stream, place));
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
                    // The trees are the next daemon's now: no connection's end kills them.
                    close_connections(&daemon, ClosingReason::HandOver).await;
                    return Ok(());
                }
                tracing::warn!("SIGHUP ignored: not pinned, so nothing could take over");
            }
        }
    }
    tracing::info!("shutting down: killing every live tree");
    close_listener(&daemon, listener);
    remove_sockets(&daemon.config);
    let _ = daemon.jobs.shutdown().await;
    // Told after the kill: a host hears its trees' ends before the connection's.
    close_connections(&daemon, ClosingReason::Shutdown).await;
    tracing::info!("stopped");
    Ok(())
}

/// How long a stopping daemon waits for its connections to take their last line.
const CLOSING_PATIENCE: Duration = Duration::from_secs(3);

/// Closes every connection, each with a `closing` event for `reason` as its last line, and
/// waits for them a bounded time: a client that does not read is closed as the daemon exits.
async fn close_connections(daemon: &Daemon, reason: ClosingReason) {
    let left = daemon
        .stopping
        .close_connections(reason, CLOSING_PATIENCE)
        .await;
    if left > 0 {
        tracing::info!(
            connections = left,
            reason = reason.as_str(),
            "connections that did not take their last line are closed unread"
        );
    }
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
        if daemon.take_memory_freed() {
            tokio::task::spawn_blocking(sys::release_free_memory);
        }
    }
}
