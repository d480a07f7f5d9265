//! The request side of a connection: its bytes, and the pidfds sent with them. A client names a
//! process to register by a pidfd attached to the request's line (SCM_RIGHTS): right in any pid
//! namespace, where a pid is a number of the client's. Reading with recvmsg keeps them; a plain
//! read would have the kernel drop them.
//!
//! A pidfd belongs to the line it was sent with, and only a `register` on that line that says
//! `"pidfd": true` takes it; one that no request took is closed as the next line is served. So
//! a request refused before it is read (over the uid's rate, say) cannot leave its pidfd to
//! the next one. The kernel hands descriptors over with the first byte of the message they
//! came with, and a recvmsg returns no data past that message: descriptors read with a chunk
//! belong to the last line that begins in it. At most [`MAX_WAITING`] wait; more are closed. A
//! descriptor that is not a pidfd ends the connection, and is closed on a thread of its own:
//! closing a file can wait on its filesystem (a FUSE server that never answers a flush), and no
//! client may make the daemon wait.

use std::{
    collections::VecDeque,
    io,
    os::fd::{AsFd, OwnedFd},
    pin::Pin,
    sync::{Arc, Mutex, OnceLock, mpsc},
    task::{Context, Poll, ready},
};

use tokio::{
    io::{AsyncRead, Interest, ReadBuf},
    net::unix::OwnedReadHalf,
};

use crate::{proc, sys};

/// Pidfds waiting for their requests, per connection.
pub const MAX_WAITING: usize = 4;

/// The pidfds a connection sent that no request has taken yet, each with the number of the
/// line it came with (counted from 0).
#[derive(Clone, Default)]
pub struct Pidfds(Arc<Mutex<VecDeque<(u64, OwnedFd)>>>);

impl Pidfds {
    fn waiting(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, OwnedFd)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pidfd that came with line `line`, if one did. Those of earlier lines, which no
    /// request took, are closed.
    pub fn take(&self, line: u64) -> Option<OwnedFd> {
        let mut waiting = self.waiting();
        while waiting
            .front()
            .is_some_and(|(sent_with, _)| *sent_with < line)
        {
            waiting.pop_front();
        }
        match waiting.front() {
            Some((sent_with, _)) if *sent_with == line => waiting.pop_front().map(|(_, fd)| fd),
            _ => None,
        }
    }

    fn keep(&self, line: u64, pidfd: OwnedFd) {
        let mut waiting = self.waiting();
        if waiting.len() < MAX_WAITING {
            waiting.push_back((line, pidfd));
        } else {
            tracing::debug!("more pidfds than requests to take them: one closed");
        }
    }
}

/// A connection's read half, read with recvmsg.
pub struct RequestStream {
    half: OwnedReadHalf,
    pidfds: Pidfds,
    /// Newlines read so far: the number of the line the next byte is in.
    newlines: u64,
}

impl RequestStream {
    pub fn new(half: OwnedReadHalf, pidfds: Pidfds) -> Self {
        Self {
            half,
            pidfds,
            newlines: 0,
        }
    }

    /// Counts the lines of `chunk`, just read, and files the descriptors that came with it
    /// under the last line that begins in it. Err: something that is not a pidfd.
    fn file(&mut self, chunk: &[u8], received: Vec<OwnedFd>) -> io::Result<()> {
        let line = last_line_begun(self.newlines, chunk);
        self.newlines += newlines(chunk);
        let mut not_pidfds = 0;
        for fd in received {
            if proc::pidfd_pid(fd.as_fd()).is_some() {
                self.pidfds.keep(line, fd);
            } else {
                not_pidfds += 1;
                dispose(fd);
            }
        }
        if not_pidfds > 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a descriptor that is not a pidfd",
            ));
        }
        Ok(())
    }
}

fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// The number of the last line that begins in `chunk`, read after `newlines_before` newlines
/// (or of the line it continues, if none begins in it). A newline that ends the chunk begins
/// the next line outside it.
fn last_line_begun(newlines_before: u64, chunk: &[u8]) -> u64 {
    let inner = &chunk[..chunk.len().saturating_sub(1)];
    newlines_before + newlines(inner)
}

impl AsyncRead for RequestStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let stream = this.half.as_ref();
            ready!(stream.poll_read_ready(cx))?;
            let mut received = Vec::new();
            let read = stream.try_io(Interest::READABLE, || {
                sys::recv_with_fds(stream.as_fd(), buf.initialize_unfilled(), &mut received)
            });
            let chunk = match &read {
                Ok(read) => &buf.initialize_unfilled()[..*read],
                Err(_) => &[],
            };
            this.file(chunk, received)?;
            match read {
                Ok(read) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                // Not ready after all: try_io cleared the readiness; wait for it again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

/// Closes `fd` on the one thread that closes what clients sent and the daemon does not keep.
fn dispose(fd: OwnedFd) {
    static DISPOSAL: OnceLock<Option<mpsc::Sender<OwnedFd>>> = OnceLock::new();
    let disposal = DISPOSAL.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("leash-fd-disposal".into())
            .spawn(move || receiver.into_iter().for_each(drop))
            .ok()
            .map(|_| sender)
    });
    match disposal {
        Some(sender) => {
            // The thread runs as long as the daemon: the send cannot fail.
            let _ = sender.send(fd);
        }
        // No thread could be started: closed here, as a last resort.
        None => drop(fd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_go_with_the_last_line_begun_in_their_chunk() {
        assert_eq!(last_line_begun(0, b"{\"id\":1}\n"), 0);
        assert_eq!(last_line_begun(0, b"{\"id\":1}\n{\"id\":2}\n"), 1);
        assert_eq!(last_line_begun(3, b"tail\n{\"id\":5"), 4);
        assert_eq!(last_line_begun(3, b"middle of line 3"), 3);
        assert_eq!(last_line_begun(3, b""), 3);
    }

    #[test]
    fn a_pidfd_no_request_took_is_closed_when_a_later_line_is_served() {
        let pidfds = Pidfds::default();
        let fd = |_| OwnedFd::from(std::io::pipe().unwrap().0);
        pidfds.keep(2, fd(()));
        pidfds.keep(4, fd(()));
        assert!(pidfds.take(1).is_none(), "not line 1's");
        assert!(
            pidfds.take(3).is_none(),
            "line 2's is closed, not given to line 3"
        );
        assert!(pidfds.take(4).is_some());
        assert!(pidfds.waiting().is_empty());
    }
}
