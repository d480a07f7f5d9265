//! Serving a connection once it is set up: its requests one at a time, its replies and events
//! out through its outbox (written by a task of its own), until the lease ends; then the end
//! of the lease, and a `closing` event when the daemon closes the connection itself.

use std::{io, os::fd::OwnedFd, sync::Arc, time::Duration};

use leash_client::protocol::{
    ClosingReason, ErrorCode, Event, MAX_LINE_BYTES, MAX_QUOTED_BYTES, ServerLine,
};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, BufReader, unix::AsyncFd},
    net::{UnixStream, unix::OwnedWriteHalf},
    sync::oneshot,
};

use crate::daemon::{
    io::{
        outbox::{Outbox, encode},
        request_stream::{Pidfds, RequestStream, Strangers},
        stopping::Listener,
    },
    requests::{Response, Session},
    rules::{lease_end::LeaseEnd, peer::Peer},
    state::shared::Daemon,
};

/// How long a closing connection's queued replies may take to go out.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a client may leave a full queue of replies unread before it is disconnected.
const UNREAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves requests until the lease ends, then ends it. Returns the connection's socket (None
/// only if its writer task failed, which dropped its half there).
pub(in crate::daemon) async fn serve_lease(
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
        peer.process.pid,
        pidfds.clone(),
        strangers.clone(),
        peer.account,
        daemon.disposal.clone(),
    ));
    let outbox = Outbox::counted(daemon.metrics.clone());
    let writer = Writer::spawn(outbox.clone(), writer);
    let mut session = Session {
        peer,
        subscribed: false,
        pidfds,
        strangers,
    };
    let ended = serve_requests(daemon, &mut reader, &outbox, &mut session, host, stopping).await;
    daemon.subscribers.remove(peer.lease);
    let closing = end(daemon, peer, ended);
    drop(session);
    close_outbox(&outbox, peer.lease, closing).await;
    let writer = writer.finish().await?;
    reader.into_inner().into_half().reunite(writer).ok()
}

/// Serves requests, one at a time, until the lease ends: why it did.
async fn serve_requests(
    daemon: &Arc<Daemon>,
    reader: &mut BufReader<RequestStream>,
    outbox: &Outbox,
    session: &mut Session,
    host: &AsyncFd<OwnedFd>,
    stopping: &mut Listener,
) -> Ended {
    let peer = session.peer;
    // The number of the request line being served, counted from 0: pidfds go with their line.
    let mut line_number = 0u64;
    loop {
        // A client reads its replies, or it is asked nothing more: the next request waits until
        // its replies have gone out, and one that stops reading is disconnected.
        let room = match unless_ended(outbox.room_for_replies(UNREAD_TIMEOUT), host, stopping).await
        {
            Ok(room) => room,
            Err(ended) => return ended,
        };
        if !room {
            return if outbox.is_closed() {
                Ended::By(LeaseEnd::ConnectionError)
            } else {
                Ended::NotReading
            };
        }
        let request = match unless_ended(read_line(reader, MAX_LINE_BYTES), host, stopping).await {
            Ok(request) => request,
            Err(ended) => return ended,
        };
        match request {
            Ok(Line::Complete(bytes)) => {
                let response = session.handle(daemon, &bytes, line_number).await;
                line_number += 1;
                if let Some(pause) = dispatch(daemon, outbox, peer, response) {
                    // Over its uid's request rate: read nothing more from it meanwhile, but
                    // still see its host's death at once.
                    let paused = unless_ended(tokio::time::sleep(pause), host, stopping).await;
                    if let Err(ended) = paused {
                        return ended;
                    }
                }
            }
            Ok(Line::TooLong(start)) => {
                let message = format!("request lines are limited to {MAX_LINE_BYTES} bytes");
                match session.refuse_stranger(line_number, ErrorCode::TooLong, &start) {
                    // Another process sent it: the host is told by an event, not a reply.
                    Some(event) => {
                        outbox.event_to_number(&event, peer.numbering, event_bytes(&event));
                    }
                    None => outbox.reply(&ServerLine::error(None, ErrorCode::TooLong, message)),
                }
                line_number += 1;
            }
            Ok(Line::End) => return Ended::By(LeaseEnd::ConnectionClosed),
            Err(_) => return Ended::By(LeaseEnd::ConnectionError),
        }
        // Requests already read are served one at a time, each in its turn with every other
        // connection's (and this one's writer).
        tokio::task::yield_now().await;
        if outbox.overflowed() {
            return Ended::NotReading;
        }
        if outbox.is_closed() {
            return Ended::By(LeaseEnd::ConnectionError);
        }
    }
}

/// `work`, unless the host dies or the daemon stops first: then why the lease ends.
async fn unless_ended<T>(
    work: impl Future<Output = T>,
    host: &AsyncFd<OwnedFd>,
    stopping: &mut Listener,
) -> Result<T, Ended> {
    tokio::select! {
        done = work => Ok(done),
        _ = host.readable() => Err(Ended::By(LeaseEnd::HostExited)),
        reason = stopping.stopping() => Err(Ended::DaemonStopping(reason)),
    }
}

/// Sends `response` on its way; the pause it asks for, if any.
fn dispatch(daemon: &Daemon, outbox: &Outbox, peer: Peer, response: Response) -> Option<Duration> {
    match response {
        Response::Now(line) => {
            outbox.reply(&line);
            None
        }
        Response::Later(reply) => {
            // The connection goes on serving; the reply goes out when it comes (the outbox
            // counts it as still to come until then: see `Outbox::is_settled`).
            let outbox = outbox.clone();
            tokio::spawn(async move { outbox.reply(&reply.await) });
            None
        }
        Response::Subscribe(hears, line) => {
            daemon.subscribers.add(
                hears,
                peer.lease,
                outbox.clone(),
                peer.numbering,
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
            outbox.event_to_number(&event, peer.numbering, event_bytes(&event));
            pause
        }
    }
}

/// Ends the lease as `ended` says, unless the daemon is stopping; the `closing` event's reason
/// for the client, if it gets one.
fn end(daemon: &Daemon, peer: Peer, ended: Ended) -> Option<ClosingReason> {
    let reason = match ended {
        // The daemon is stopping: what becomes of the lease's trees is its to do (killed at a
        // shutdown before the connections are told, kept at a hand-over), not the lease's end.
        Ended::DaemonStopping(reason) => {
            tracing::debug!(reason = reason.as_str(), "closing: the daemon is stopping");
            return Some(reason);
        }
        // A dying host's sockets close before its pidfd says it exited: its end is its exit.
        Ended::By(LeaseEnd::ConnectionClosed | LeaseEnd::ConnectionError)
            if peer.process.is_exiting() =>
        {
            LeaseEnd::HostExited
        }
        Ended::By(reason) => reason,
        Ended::NotReading => LeaseEnd::ClientNotReading,
    };
    // The lease ends first: its trees' kills never wait on the connection's last replies.
    daemon.jobs.end_lease(peer.lease, reason);
    matches!(ended, Ended::NotReading).then_some(ClosingReason::NotReading)
}

/// Replies still to come (a kill's) and queued ones go out for a moment, but the daemon never
/// waits on a client that stopped reading; then the last line, `closing`'s if it has one.
/// Best effort: a client that overflowed its replies is sent nothing more.
async fn close_outbox(outbox: &Outbox, lease: u64, closing: Option<ClosingReason>) {
    let settled = async {
        while !outbox.is_settled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, settled).await;
    match closing {
        Some(reason) => outbox.close_with(&ServerLine::event(Event::closing(lease, reason))),
        None => outbox.close(),
    }
}

/// The connection's writer task: a slow reader slows only it, never the daemon.
struct Writer {
    task: tokio::task::JoinHandle<OwnedWriteHalf>,
    stop: oneshot::Sender<()>,
}

impl Writer {
    /// Writes what `outbox` holds to `half` until it is closed or the task is stopped.
    fn spawn(outbox: Outbox, mut half: OwnedWriteHalf) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tokio::select! {
                () = outbox.write_to(&mut half) => {}
                _ = stopped => {}
            }
            half
        });
        Self { task, stop }
    }

    /// Its half of the socket back, once the outbox has gone out or [`FLUSH_TIMEOUT`] has
    /// passed (then it is stopped): the socket's last close is the caller's. None only if the
    /// task failed, which dropped its half there.
    async fn finish(mut self) -> Option<OwnedWriteHalf> {
        match tokio::time::timeout(FLUSH_TIMEOUT, &mut self.task).await {
            Ok(done) => done.ok(),
            Err(_) => {
                let _ = self.stop.send(());
                self.task.await.ok()
            }
        }
    }
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
