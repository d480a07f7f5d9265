//! One client connection: its lease, its host watch, bounded request lines in, replies and
//! events out. The lease ends when the connection closes or the host process dies, whichever
//! comes first, and then every tree it holds is killed.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use leash_client::protocol::{ErrorCode, MAX_LINE_BYTES, ServerLine};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader, unix::AsyncFd},
    net::UnixStream,
    sync::{mpsc, watch},
};
use tracing::Instrument;

use super::{Daemon, enforcement, requests::Session};
use crate::sys;

/// Who is on the other end, as the kernel says.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    pub uid: u32,
    pub pid: u32,
    /// The connected process's start time in clock ticks (0 if it could not be read).
    pub start_ticks: u64,
    pub lease: u64,
}

/// Replies a client may leave unread before it is disconnected.
const QUEUED_REPLIES: usize = 1024;
/// Events queued for a subscriber before further ones are dropped (and counted).
const QUEUED_EVENTS: usize = 1024;

/// Where one connection's replies and events go; a writer task drains both. Both queues are
/// bounded, so a client that does not read costs the daemon a fixed amount of memory and never
/// any waiting.
#[derive(Clone)]
pub struct Outbox {
    replies: mpsc::Sender<ServerLine>,
    events: mpsc::Sender<ServerLine>,
    /// Set when a reply did not fit: the client is not reading, and is disconnected.
    overflowed: Arc<AtomicBool>,
}

/// Why an event was not queued.
pub enum Undelivered {
    /// The subscriber is behind: the event is dropped (and should be counted).
    Full,
    /// The connection is gone.
    Closed,
}

impl Outbox {
    pub fn reply(&self, line: ServerLine) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.replies.try_send(line) {
            self.overflowed.store(true, Ordering::Relaxed);
        }
    }

    /// Waits until the event queue has room for one line; None once the connection is gone.
    pub async fn event_room(&self) -> Option<mpsc::Permit<'_, ServerLine>> {
        self.events.reserve().await.ok()
    }

    pub fn event(&self, line: ServerLine) -> Result<(), Undelivered> {
        self.events.try_send(line).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Undelivered::Full,
            mpsc::error::TrySendError::Closed(_) => Undelivered::Closed,
        })
    }
}

pub async fn serve(daemon: Arc<Daemon>, stream: UnixStream) {
    let credentials = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("connection without peer credentials: {e}");
            return;
        }
    };
    let (uid, Some(pid)) = (credentials.uid(), credentials.pid()) else {
        tracing::warn!("connection without a peer pid");
        return;
    };
    let host = match sys::peer_pidfd(stream.as_fd(), pid as u32).and_then(sys::async_readable) {
        Ok(host) => host,
        Err(e) => {
            tracing::warn!(pid, "cannot watch the connecting process: {e}");
            return;
        }
    };
    // Read after the pidfd is open: the start time is the connected process's.
    let host_start_ticks = crate::proc::process(pid as u32).map_or(0, |p| p.start_ticks);
    let lease = match daemon.open_lease(uid, pid as u32, host_start_ticks) {
        Ok(lease) => lease,
        Err(e) => {
            tracing::error!("cannot make a lease token: {e}");
            return;
        }
    };
    let peer = Peer {
        uid,
        pid: pid as u32,
        start_ticks: host_start_ticks,
        lease,
    };
    let span = tracing::info_span!("lease", lease, uid, host = pid);
    async move {
        tracing::info!("lease opened");
        let ended_by = serve_lease(&daemon, stream, peer, &host).await;
        tracing::info!(ended_by, "lease ended");
        enforcement::end_lease(&daemon, lease);
    }
    .instrument(span)
    .await;
}

/// Serves requests until the lease ends; says why it ended.
async fn serve_lease(
    daemon: &Arc<Daemon>,
    stream: UnixStream,
    peer: Peer,
    host: &AsyncFd<OwnedFd>,
) -> &'static str {
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    let (replies, mut queued_replies) = mpsc::channel::<ServerLine>(QUEUED_REPLIES);
    let (events, mut queued_events) = mpsc::channel::<ServerLine>(QUEUED_EVENTS);
    let overflowed = Arc::new(AtomicBool::new(false));
    let outbox = Outbox {
        replies,
        events,
        overflowed: overflowed.clone(),
    };
    // A slow reader slows only its own writer task, never the daemon.
    let writer_task = tokio::spawn(async move {
        loop {
            let line = tokio::select! {
                biased;
                Some(line) = queued_replies.recv() => line,
                Some(line) = queued_events.recv() => line,
                else => break,
            };
            let mut bytes = match serde_json::to_vec(&line) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::error!("cannot encode a reply: {e}");
                    continue;
                }
            };
            bytes.push(b'\n');
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    let (closing, closing_seen) = watch::channel(false);
    let mut session = Session {
        peer,
        outbox: outbox.clone(),
        closing: closing_seen,
        subscribed: false,
    };
    let ended_by = loop {
        tokio::select! {
            line = read_line(&mut reader, MAX_LINE_BYTES) => match line {
                Ok(Line::Complete(bytes)) => session.handle(daemon, &bytes),
                Ok(Line::TooLong) => outbox.reply(ServerLine::error(
                    None,
                    ErrorCode::TooLong,
                    format!("request lines are limited to {MAX_LINE_BYTES} bytes"),
                )),
                Ok(Line::End) => break "connection closed",
                Err(_) => break "connection error",
            },
            _ = host.readable() => break "host exited",
        }
        if overflowed.load(Ordering::Relaxed) {
            break "client does not read its replies";
        }
    };
    let _ = closing.send(true);
    drop((outbox, session));
    // Let queued replies go out, but never wait on a client that stopped reading.
    let _ = tokio::time::timeout(Duration::from_secs(1), writer_task).await;
    ended_by
}

enum Line {
    Complete(Vec<u8>),
    /// Longer than the limit: it was read and thrown away up to its newline.
    TooLong,
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
        if !too_long {
            if line.len() + take > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(&available[..take]);
            }
        }
        reader.consume(take + usize::from(done));
        if done {
            return Ok(if too_long {
                Line::TooLong
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
            Line::TooLong
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
