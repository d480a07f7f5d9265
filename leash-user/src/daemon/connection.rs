//! One client connection: its lease, its host watch, bounded request lines in, replies and
//! events out. The lease ends when the connection closes or the host process dies, whichever
//! comes first, and then every tree it holds is killed. When the daemon closes a connection
//! itself (it stops, or the client does not read), its last line is a `closing` event that
//! says why.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use leash_client::protocol::{
    ClosingReason, ErrorCode, Event, MAX_LINE_BYTES, MAX_QUOTED_BYTES, ServerLine,
};
use leash_common::Account;
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, BufReader, unix::AsyncFd},
    net::{UnixListener, UnixStream},
    sync::oneshot,
};
use tracing::Instrument;

use super::{
    accept::{self, AcceptFailures},
    admission::Place,
    disposal::PARKED_PER_ACCOUNT,
    identity,
    lease_end::LeaseEnd,
    limits::ConnectionSlot,
    outbox::{Outbox, encode},
    peer::Peer,
    pid_view::PidView,
    request_stream::{Pidfds, RequestStream, Strangers},
    requests::{Response, Session},
    shared::Daemon,
    stopping::Listener,
};
use crate::sys;

/// How long a closing connection's queued replies may take to go out.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a client may leave a full queue of replies unread before it is disconnected.
const UNREAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refused connection's one line may wait for room in its socket.
const REFUSAL_PATIENCE: Duration = Duration::from_millis(500);

/// Serves a connection, then closes the daemon's end of it apart (`disposal`): a client may
/// have left descriptors queued on it, and the last close of the socket closes them. So the
/// socket is never dropped on the way: setting up only borrows it, and serving hands it back.
pub(super) async fn serve(daemon: Arc<Daemon>, stream: UnixStream, place: Place) {
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
            let span =
                tracing::info_span!("lease", lease = peer.lease, uid = peer.uid, host = peer.pid);
            // Dropped when the connection ends, which ends the owner's watch.
            let (_serving, served) = oneshot::channel::<()>();
            daemon.jobs.watch_host(peer.lease, for_owner, served);
            let stream = async {
                // DEBUG: most connections only ask; a lease that holds a tree says so at INFO
                // then.
                tracing::debug!("lease opened");
                let stream = serve_lease(&daemon, stream, peer, &host, &mut stopping).await;
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
pub(super) async fn next_admitted(
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
    let Some(pid) = credentials.pid() else {
        tracing::warn!("connection without a peer pid");
        return Err((uid.into(), None));
    };
    let refused = || Err((Account::from(uid), None));
    // Nothing of the host's is opened before it is identified: a connection that waits its
    // turn to be asked about costs its socket alone (and its place in the queue, per uid).
    let host_start_ticks = match crate::proc::read_process(pid as u32) {
        Ok(Some(process)) => process.start_ticks,
        Ok(None) => return refused(),
        Err(e) => {
            setup_failed(daemon, pid, "cannot read the connecting process", &e);
            return refused();
        }
    };
    // Its pid namespace, from its numbers in each (None: it has exited).
    let Some(view) = PidView::of_client(pid as u32) else {
        return refused();
    };
    let who = match identity::identify(daemon, pid as u32, uid, view).await {
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
    let watched = sys::peer_pidfd(stream.as_fd(), pid as u32).and_then(|pidfd| {
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
    if !still_running(pid as u32, host_start_ticks) {
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
    let opened = daemon.registry.open_lease(
        uid,
        who.account,
        who.pid_namespaces.clone(),
        pid as u32,
        host_start_ticks,
    );
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
        pid: pid as u32,
        start_ticks: host_start_ticks,
        lease,
        may_be_impersonated: !view.is_daemons() && who.in_user_namespace,
        view,
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

/// Whether the host `pid` (started at `start_ticks`, 0 if unknown) is gone or on its way out:
/// the kernel marks a process exiting (PF_EXITING) before it closes its files.
fn host_exiting(pid: u32, start_ticks: u64) -> bool {
    const PF_EXITING: u32 = 0x4;
    match procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
        Ok(stat) => {
            (start_ticks != 0 && stat.starttime != start_ticks)
                || matches!(stat.state, 'Z' | 'X')
                || stat.flags & PF_EXITING != 0
        }
        Err(procfs::ProcError::NotFound(_)) => true,
        Err(_) => false,
    }
}

/// Whether process `pid` is still the one that started at `start_ticks`.
fn still_running(pid: u32, start_ticks: u64) -> bool {
    crate::proc::read_process(pid).is_ok_and(|p| p.is_some_and(|p| p.start_ticks == start_ticks))
}

/// A connection that could not be set up is dropped (out of descriptors, say: it is the
/// client's to try again). Logged at most once every 10 s, with the count since the last line:
/// a client connecting in a loop must not fill the disk.
fn setup_failed(daemon: &Daemon, pid: i32, what: &str, error: &std::io::Error) {
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

/// Serves requests until the lease ends, then ends it. Returns the connection's socket (None
/// only if its writer task failed, which dropped its half there).
async fn serve_lease(
    daemon: &Arc<Daemon>,
    stream: UnixStream,
    peer: Peer,
    host: &AsyncFd<OwnedFd>,
    stopping: &mut Listener,
) -> Option<UnixStream> {
    let (reader, writer) = stream.into_split();
    let (pidfds, strangers) = (Pidfds::default(), Strangers::default());
    let mut reader = BufReader::new(RequestStream::new(
        reader,
        peer.pid,
        pidfds.clone(),
        strangers.clone(),
        peer.account,
        daemon.disposal.clone(),
    ));
    let outbox = Outbox::counted(daemon.metrics.clone());
    // A slow reader slows only its own writer task, never the daemon. Stopped, the task hands
    // its half back: the socket's last close is the caller's.
    let (stop_writer, stopped) = oneshot::channel::<()>();
    let mut writer_task = tokio::spawn({
        let outbox = outbox.clone();
        let mut writer = writer;
        async move {
            tokio::select! {
                () = outbox.write_to(&mut writer) => {}
                _ = stopped => {}
            }
            writer
        }
    });
    let mut session = Session {
        peer,
        subscribed: false,
        pidfds,
        strangers,
    };
    // The number of the request line being served, counted from 0: pidfds go with their line.
    let mut line_number = 0u64;
    let ended_by = loop {
        // A client reads its replies, or it is asked nothing more: the next request waits until
        // its replies have gone out, and one that stops reading is disconnected.
        let room = tokio::select! {
            room = outbox.room_for_replies(UNREAD_TIMEOUT) => room,
            _ = host.readable() => break Ended::By(LeaseEnd::HostExited),
            reason = stopping.stopping() => break Ended::DaemonStopping(reason),
        };
        if !room {
            break if outbox.is_closed() {
                Ended::By(LeaseEnd::ConnectionError)
            } else {
                Ended::NotReading
            };
        }
        let request = tokio::select! {
            line = read_line(&mut reader, MAX_LINE_BYTES) => line,
            _ = host.readable() => break Ended::By(LeaseEnd::HostExited),
            reason = stopping.stopping() => break Ended::DaemonStopping(reason),
        };
        match request {
            Ok(Line::Complete(bytes)) => {
                let response = session.handle(daemon, &bytes, line_number).await;
                line_number += 1;
                let pause = match response {
                    Response::Now(line) => {
                        outbox.reply(&line);
                        None
                    }
                    Response::Later(reply) => {
                        // The connection goes on serving; the reply goes out when it comes
                        // (the outbox counts it as still to come until then: see
                        // `Outbox::is_settled`).
                        let outbox = outbox.clone();
                        tokio::spawn(async move { outbox.reply(&reply.await) });
                        None
                    }
                    Response::Subscribe(hears, line) => {
                        daemon.subscribers.add(
                            hears,
                            peer.lease,
                            outbox.clone(),
                            peer.view,
                            peer.pid_namespace,
                        );
                        outbox.reply(&line);
                        None
                    }
                    Response::Pause(line, pause) => {
                        outbox.reply(&line);
                        Some(pause)
                    }
                    Response::Event(event, pause) => {
                        outbox.event_to_number(&event, peer.view, event_bytes(&event));
                        pause
                    }
                };
                if let Some(pause) = pause {
                    // Over its uid's request rate: read nothing more from it meanwhile, but
                    // still see its host's death at once.
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = host.readable() => break Ended::By(LeaseEnd::HostExited),
                        reason = stopping.stopping() => break Ended::DaemonStopping(reason),
                    }
                }
            }
            Ok(Line::TooLong(start)) => {
                let message = format!("request lines are limited to {MAX_LINE_BYTES} bytes");
                match session.refuse_stranger(line_number, ErrorCode::TooLong, &start) {
                    // Another process sent it: the host is told by an event, not a reply.
                    Some(event) => {
                        outbox.event_to_number(&event, peer.view, event_bytes(&event));
                    }
                    None => outbox.reply(&ServerLine::error(None, ErrorCode::TooLong, message)),
                }
                line_number += 1;
            }
            Ok(Line::End) => break Ended::By(LeaseEnd::ConnectionClosed),
            Err(_) => break Ended::By(LeaseEnd::ConnectionError),
        }
        // Requests already read are served one at a time, each in its turn with every other
        // connection's (and this one's writer).
        tokio::task::yield_now().await;
        if outbox.overflowed() {
            break Ended::NotReading;
        }
        if outbox.is_closed() {
            break Ended::By(LeaseEnd::ConnectionError);
        }
    };
    let lease = peer.lease;
    daemon.subscribers.remove(lease);
    let closing = match ended_by {
        // The daemon is stopping: what becomes of the lease's trees is its to do (killed at a
        // shutdown before the connections are told, kept at a hand-over), not the lease's end.
        Ended::DaemonStopping(reason) => {
            tracing::debug!(reason = reason.as_str(), "closing: the daemon is stopping");
            Some(reason)
        }
        ended => {
            // A dying host's sockets close before its pidfd says it exited: its end is its
            // exit.
            let reason = match ended {
                Ended::By(LeaseEnd::ConnectionClosed | LeaseEnd::ConnectionError)
                    if host_exiting(peer.pid, peer.start_ticks) =>
                {
                    LeaseEnd::HostExited
                }
                Ended::By(reason) => reason,
                Ended::NotReading | Ended::DaemonStopping(_) => LeaseEnd::ClientNotReading,
            };
            // The lease ends first: its trees' kills never wait on the connection's last
            // replies.
            daemon.jobs.end_lease(lease, reason);
            matches!(ended, Ended::NotReading).then_some(ClosingReason::NotReading)
        }
    };
    // Replies still to come (a kill's) and queued ones go out for a moment, but the daemon never
    // waits on a client that stopped reading.
    drop(session);
    let settled = async {
        while !outbox.is_settled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, settled).await;
    // Best effort: a client that overflowed its replies is sent nothing more.
    match closing {
        Some(reason) => outbox.close_with(&ServerLine::event(Event::closing(lease, reason))),
        None => outbox.close(),
    }
    let writer = match tokio::time::timeout(FLUSH_TIMEOUT, &mut writer_task).await {
        Ok(done) => done,
        Err(_) => {
            let _ = stop_writer.send(());
            writer_task.await
        }
    };
    let writer = writer.ok()?;
    reader.into_inner().into_half().reunite(writer).ok()
}

/// Why a connection's serving ended.
#[derive(Clone, Copy)]
enum Ended {
    /// The lease ends, for this reason.
    By(LeaseEnd),
    /// The client left its replies unread: the lease ends (`client_not_reading`), and the
    /// client is told why.
    NotReading,
    /// The daemon is stopping: the lease is left to it, and the client is told why.
    DaemonStopping(ClosingReason),
}

/// What an event counts for in an outbox's queue: its line as the daemon numbers it.
fn event_bytes(event: &Event) -> usize {
    encode(&ServerLine::event(event.clone())).len()
}

enum Line {
    Complete(Vec<u8>),
    /// Longer than the limit: it was read and thrown away up to its newline, but for its
    /// first [`MAX_QUOTED_BYTES`] (for a `refused` event).
    TooLong(Vec<u8>),
    End,
}

/// Reads one newline-terminated line of at most `max` bytes, holding no more than that in
/// memory however long the line is.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin), max: usize) -> io::Result<Line> {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(Line::End);
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline, true),
            None => (available.len(), false),
        };
        // At most `max` bytes with the newline: `max` without it is too long already.
        if !too_long && line.len() + take >= max {
            too_long = true;
            line.truncate(MAX_QUOTED_BYTES);
            line.shrink_to_fit();
        }
        if too_long {
            // Only its start is kept, for a `refused` event.
            let room = MAX_QUOTED_BYTES.saturating_sub(line.len()).min(take);
            line.extend_from_slice(&available[..room]);
        } else {
            line.extend_from_slice(&available[..take]);
        }
        reader.consume(take + usize::from(done));
        if done {
            return Ok(if too_long {
                Line::TooLong(line)
            } else {
                Line::Complete(line)
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_the_rest_still_read() {
        let mut input = "short\n".to_owned();
        input.push_str(&"x".repeat(1000));
        input.push_str("\nafter\n");
        let mut reader = BufReader::with_capacity(16, input.as_bytes());
        assert!(
            matches!(read_line(&mut reader, 100).await.unwrap(), Line::Complete(l) if l == b"short")
        );
        assert!(matches!(
            read_line(&mut reader, 100).await.unwrap(),
            Line::TooLong(start) if start == [b'x'; MAX_QUOTED_BYTES]
        ));
        assert!(
            matches!(read_line(&mut reader, 100).await.unwrap(), Line::Complete(l) if l == b"after")
        );
        assert!(matches!(
            read_line(&mut reader, 100).await.unwrap(),
            Line::End
        ));
    }
}
