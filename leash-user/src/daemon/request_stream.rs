//! The request side of a connection: its bytes, and the pidfds sent with them. A client names a
//! process to register by a pidfd attached to the request's line (SCM_RIGHTS): right in any pid
//! namespace, where a pid is a number of the client's. Reading with recvmsg keeps them; a plain
//! read would have the kernel drop them.
//!
//! Pidfds wait, in the order they came, for the requests that say `"pidfd": true`: the n-th such
//! request takes the n-th pidfd. At most [`MAX_WAITING`] wait; more are closed. A descriptor
//! that is not a pidfd ends the connection, and is closed on a thread of its own: closing a
//! file can wait on its filesystem (a FUSE server that never answers a flush), and no client
//! may make the daemon wait.

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

/// The pidfds a connection sent that no request has taken yet.
#[derive(Clone, Default)]
pub struct Pidfds(Arc<Mutex<VecDeque<OwnedFd>>>);

impl Pidfds {
    /// The oldest pidfd no request has taken.
    pub fn take(&self) -> Option<OwnedFd> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }

    fn keep(&self, pidfd: OwnedFd) {
        let mut waiting = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.len() < MAX_WAITING {
            waiting.push_back(pidfd);
        } else {
            tracing::debug!("more pidfds than requests to take them: one closed");
        }
    }
}

/// A connection's read half, read with recvmsg.
pub struct RequestStream {
    half: OwnedReadHalf,
    pidfds: Pidfds,
}

impl RequestStream {
    pub fn new(half: OwnedReadHalf, pidfds: Pidfds) -> Self {
        Self { half, pidfds }
    }

    /// Files what came with the bytes read. Err: something that is not a pidfd.
    fn file(&self, received: Vec<OwnedFd>) -> io::Result<()> {
        let mut not_pidfds = 0;
        for fd in received {
            if proc::pidfd_pid(fd.as_fd()).is_some() {
                self.pidfds.keep(fd);
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

impl AsyncRead for RequestStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let stream = this.half.as_ref();
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let mut received = Vec::new();
            let read = stream.try_io(Interest::READABLE, || {
                sys::recv_with_fds(stream.as_fd(), buf.initialize_unfilled(), &mut received)
            });
            this.file(received)?;
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
