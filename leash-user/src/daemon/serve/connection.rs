//! One client connection: admitted, set up (who it is, its account's slot, its lease, its host
//! watched), served (see `lease`), then closed apart. The lease ends when the connection
//! closes or the host process dies, whichever comes first, and then every tree it holds is
//! killed.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use leash_client::protocol::{ErrorCode, ServerLine};
use leash_common::Account;
use tokio::{
    io::unix::AsyncFd,
    net::{UnixListener, UnixStream},
    sync::oneshot,
};
use tracing::Instrument;

use super::lease;
use crate::{
    daemon::{
        io::{
            accept::{self, AcceptFailures},
            admission::Place,
            disposal::PARKED_PER_ACCOUNT,
            outbox::encode,
        },
        rules::{limits::ConnectionSlot, peer::Peer, pid_numbering::PidNumbering},
        state::{identity, shared::Daemon},
    },
    sys,
};

/// How long a refused connection's one line may wait for room in its socket.
const REFUSAL_PATIENCE: Duration = Duration::from_millis(500);

/// Serves a connection, then closes the daemon's end of it apart (`disposal`): a client may
/// have left descriptors queued on it, and the last close of the socket closes them. So the
/// socket is never dropped on the way: setting up only borrows it, and serving hands it back.
pub(in crate::daemon) async fn serve(daemon: Arc<Daemon>, stream: UnixStream, place: Place) {
    // Held until the connection is closed: a stopping daemon waits for its last line.
    let mut stopping = daemon.stopping.listen();
    // First: from now on the kernel names the sender of every request (see request_stream). A
    // connection it cannot be set on is served all the same, its requests taken as the host's.
    if let Err(e) = sys::set_passcred(stream.as_fd()) {
        tracing::warn!("cannot have the kernel name each request's sender (SO_PASSCRED): {e}");
    }
    let credentials = stream.peer_cred();
    let (stream, account, slot) = match set_up(&daemon, &stream, credentials, place).await {
        Err((account, slot)) => (Some(stream), account, slot),
        Ok(lease) => {
            let Lease {
                slot,
                peer,
                host,
                for_owner,
            } = lease;
            let span = tracing::info_span!(
                "lease",
                lease = peer.lease,
                uid = peer.uid,
                host = peer.process.pid
            );
            // Dropped when the connection ends, which ends the owner's watch.
            let (_serving, served) = oneshot::channel::<()>();
            daemon.jobs.watch_host(peer.lease, for_owner, served);
            let stream = async {
                // DEBUG: most connections only ask; a lease that holds a tree says so at INFO
                // then.
                tracing::debug!("lease opened");
                let stream = lease::serve_lease(&daemon, stream, peer, &host, &mut stopping).await;
                daemon.memory_freed();
                stream
            }
            .instrument(span)
            .await;
            (stream, peer.account, Some(slot))
        }
    };
    let Some(stream) = stream else {
        return;
    };
    match stream.into_std() {
        Ok(stream) => {
            let slot = slot.map(|slot| Box::new(slot) as Box<dyn Send>);
            daemon
                .disposal
                .close_connection(account, stream.into(), slot);
        }
        // It could not be taken from tokio, and was closed there.
        Err(e) => tracing::warn!(account, "dropping a connection: {e}"),
    }
    drop(stopping);
}

/// The next connection admitted: room for it taken, accepted, and its uid's place given. One
/// over its uid's places is refused at once (a line, if its socket takes it now) and closed.
/// Cancel-safe (it waits in `select!` beside the signals): it waits only for room and for
/// accept, and loses neither when dropped there.
pub(in crate::daemon) async fn next_admitted(
    daemon: &Daemon,
    listener: &UnixListener,
    failures: &mut AcceptFailures,
) -> (UnixStream, Place) {
    loop {
        let room = daemon.admission.room().await;
        let stream = accept::next_connection(listener, failures).await;
        // Unknown, it is charged as uid -1, which no user has.
        let uid = stream.peer_cred().map_or(u32::MAX, |c| c.uid());
        let placed = if uid != 0 && daemon.disposal.parked_full(uid.into()) {
            Err(format!(
                "uid {uid} has {PARKED_PER_ACCOUNT} connections waiting to be closed behind a \
                 close of its descriptors that has not returned; try again once it has"
            ))
        } else {
            daemon.admission.place(room, uid)
        };
        match placed {
            Ok(place) => return (stream, place),
            Err(why) => refuse(daemon, stream, uid, why),
        }
    }
}

/// Refuses a connection without waiting on it: its one line only if its socket takes it now.
fn refuse(daemon: &Daemon, stream: UnixStream, uid: u32, why: String) {
    daemon.metrics.refused(ErrorCode::LimitReached);
    if let Some(count) = daemon.admission.log_refusal() {
        tracing::warn!(
            uid,
            refused = count,
            "over its limit: refusing ({why}; logged at most every 10 s)"
        );
    }
    let Ok(stream) = stream.into_std() else {
        return;
    };
    // Non-blocking, as tokio left it: a socket that cannot take the line now goes without it.
    let line = encode(&ServerLine::error(None, ErrorCode::LimitReached, why));
    let _ = std::io::Write::write(&mut &stream, &line);
    daemon
        .disposal
        .close_connection(uid.into(), OwnedFd::from(stream), None);
}

/// A connection set up to be served.
struct Lease {
    slot: ConnectionSlot,
    peer: Peer,
    /// The host's pidfd, readable when it exits.
    host: AsyncFd<OwnedFd>,
    /// Another, for the owner's watch.
    for_owner: OwnedFd,
}

/// Sets a connection up: its host watched, who it is, its account's slot, its lease. Err: it
/// is not served; what its socket is charged to (its account, or its uid before that is
/// known), and its slot, if it got one, to be dropped once its socket is closed.
async fn set_up(
    daemon: &Daemon,
    stream: &UnixStream,
    credentials: io::Result<tokio::net::unix::UCred>,
    place: Place,
) -> Result<Lease, (Account, Option<ConnectionSlot>)> {
    let credentials = match credentials {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("connection without peer credentials: {e}");
            // Unknown, it is charged as uid -1, which no user has.
            return Err((u32::MAX.into(), None));
        }
    };
    let uid = credentials.uid();
    let Some(pid) = credentials.pid().and_then(|pid| u32::try_from(pid).ok()) else {
        tracing::warn!("connection without a peer pid");
        return Err((uid.into(), None));
    };
    let refused = || Err((Account::from(uid), None));
    // Nothing of the host's is opened before it is identified: a connection that waits its
    // turn to be asked about costs its socket alone (and its place in the queue, per uid).
    let host_process = match crate::proc::read_process(pid) {
        Ok(Some(process)) => process.reference(),
        Ok(None) => return refused(),
        Err(e) => {
            setup_failed(daemon, pid, "cannot read the connecting process", &e);
            return refused();
        }
    };
    // Its pid namespace, from its numbers in each (None: it has exited).
    let Some(numbering) = PidNumbering::of_client(pid) else {
        return refused();
    };
    let who = match identity::identify(daemon, pid, uid, numbering).await {
        Ok(Some(who)) => who,
        Ok(None) => return refused(),
        Err(e) => {
            let e = std::io::Error::other(format!("{e:#}"));
            setup_failed(daemon, pid, "cannot tell who the connecting process is", &e);
            return refused();
        }
    };
    // Identified: its uid's place is another's to take.
    drop(place);
    // The host is watched twice: by the owner, which ends the lease the moment the host dies
    // whatever load the connections are under, and here, to stop serving.
    let watched = sys::peer_pidfd(stream.as_fd(), pid).and_then(|pidfd| {
        let for_owner = pidfd.as_fd().try_clone_to_owned()?;
        Ok((sys::async_readable(pidfd)?, for_owner))
    });
    let (host, for_owner) = match watched {
        Ok(watched) => watched,
        Err(e) => {
            setup_failed(daemon, pid, "cannot watch the connecting process", &e);
            return refused();
        }
    };
    // Checked with the pidfd open: the process it holds (the peer, or the one the pid names)
    // is the one read first and identified, so that answer and that start time are the host's.
    if !host_process.is_running() {
        return refused();
    }
    // Counted before anything else is spent on it: over its account's limit, a connection
    // costs one line and is closed.
    let slot = match daemon.limits.open_connection(who.account) {
        Ok(slot) => slot,
        Err(why) => {
            daemon.metrics.refused(ErrorCode::LimitReached);
            let line = ServerLine::error(None, ErrorCode::LimitReached, why);
            say_refusal(stream, &encode(&line)).await;
            return Err((who.account, None));
        }
    };
    let opened =
        daemon
            .registry
            .open_lease(uid, who.account, who.pid_namespaces.clone(), host_process);
    let lease = match opened {
        Ok(lease) => lease,
        Err(e) => {
            setup_failed(daemon, pid, "cannot make a lease token", &e);
            return Err((who.account, Some(slot)));
        }
    };
    let peer = Peer {
        uid,
        account: who.account,
        pid_namespace: who.pid_namespace(),
        process: host_process,
        lease,
        may_be_impersonated: !numbering.is_daemons() && who.in_user_namespace,
        numbering,
    };
    Ok(Lease {
        slot,
        peer,
        host,
        for_owner,
    })
}

/// Writes a refused connection's one line, waiting a bounded time for its socket to take it.
/// Best effort: a client that does not take it is closed all the same. A bare `try_write`
/// is not enough: tokio refuses it (WouldBlock, without trying) until its reactor has seen
/// the new socket writable, which a busy daemon may not have yet.
async fn say_refusal(stream: &UnixStream, line: &[u8]) {
    let said = async {
        loop {
            stream.writable().await?;
            match stream.try_write(line) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                written => return written.map(drop),
            }
        }
    };
    let _: Result<io::Result<()>, _> = tokio::time::timeout(REFUSAL_PATIENCE, said).await;
}

/// A connection that could not be set up is dropped (out of descriptors, say: it is the
/// client's to try again). Logged at most once every 10 s, with the count since the last line:
/// a client connecting in a loop must not fill the disk.
fn setup_failed(daemon: &Daemon, pid: u32, what: &str, error: &std::io::Error) {
    let due = daemon
        .setup_failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .failed(std::time::Instant::now());
    if let Some(failures) = due {
        tracing::warn!(
            pid,
            failures,
            "{what}: {error}; dropping the connection (at most one line every 10 s)"
        );
    }
}
