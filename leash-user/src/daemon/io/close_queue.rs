//! The disposal's overflow: descriptors to close, queued where they cost the daemon no
//! descriptor. A connection's socket that still carries its client's descriptors is closed
//! in its account's lane (see `disposal`); one whose account already has
//! [`PARKED_PER_ACCOUNT`](super::disposal::PARKED_PER_ACCOUNT) waiting there comes here
//! instead. A client whose lane is stuck on a close that never returns could otherwise have the
//! daemon hold one socket for each connection it makes and leaves a descriptor on: as many as
//! its own descriptor limit, no smaller than the daemon's.
//!
//! They go into a Unix socket the daemon holds both ends of, up to [`SCM_MAX_FD`] to a
//! message. A file queued in a message stays open, but takes no place in the daemon's table,
//! so the daemon closes its own descriptor at once (never the last close). One thread takes the
//! messages out in order and closes what they carry (emptied first: see `emptying`). While it
//! is idle, each descriptor is sent on its own, at once; while it is busy, they are gathered
//! into full messages, so the socket's send buffer (whose size root cannot raise past
//! `net.core.wmem_max` without CAP_NET_ADMIN, which the unit does not give) holds 278 messages
//! of 253 at its default size: some 70,000. What waits for a full message is at most
//! `SCM_MAX_FD` descriptors.

use std::{
    io,
    os::{
        fd::{AsFd, OwnedFd},
        unix::net::UnixStream,
    },
    sync::{Arc, Mutex, MutexGuard},
};

use super::emptying::close_emptied;
use crate::sys::{self, SCM_MAX_FD};

/// The queue: cheap to clone, one for the whole daemon.
#[derive(Clone)]
pub(in crate::daemon) struct CloseQueue(Arc<Shared>);

struct Shared {
    /// The end the daemon queues on (non-blocking).
    sender: UnixStream,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Gathered for the next full message while the thread is busy.
    gathered: Vec<OwnedFd>,
    /// Whether the thread waits for a message (and nothing is gathered).
    idle: bool,
}

impl CloseQueue {
    /// The queue and its thread.
    pub(in crate::daemon) fn start() -> io::Result<Self> {
        let (sender, receiver) = UnixStream::pair()?;
        sender.set_nonblocking(true)?;
        let queue = Self(Arc::new(Shared {
            sender,
            state: Mutex::new(State::default()),
        }));
        let serving = queue.clone();
        std::thread::Builder::new()
            .name("leash-close-queue".into())
            .spawn(move || serving.serve(&receiver))?;
        Ok(queue)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `fd` to be closed. Err: the queue is full (its socket's buffer, and a full
    /// message gathered), and `fd` is given back.
    pub(in crate::daemon) fn close(&self, fd: OwnedFd) -> Result<(), OwnedFd> {
        let mut state = self.state();
        if state.gathered.len() >= SCM_MAX_FD {
            return Err(fd);
        }
        state.gathered.push(fd);
        if state.idle || state.gathered.len() == SCM_MAX_FD {
            let fds = std::mem::take(&mut state.gathered);
            match self.send(&fds) {
                Ok(()) => state.idle = false,
                // Kept for a later message; full, the next one is refused.
                Err(_) => state.gathered = fds,
            }
        }
        Ok(())
    }

    fn send(&self, fds: &[OwnedFd]) -> io::Result<()> {
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        sys::send_fds(self.0.sender.as_fd(), &borrowed)
    }

    /// The thread: closes what each message carries, in order, and between messages what was
    /// gathered meanwhile.
    fn serve(&self, receiver: &UnixStream) {
        let mut buf = [0; 64];
        loop {
            let gathered = {
                let mut state = self.state();
                let gathered = std::mem::take(&mut state.gathered);
                state.idle = gathered.is_empty();
                gathered
            };
            if !gathered.is_empty() {
                gathered.into_iter().for_each(close_emptied);
                continue;
            }
            let mut fds = Vec::new();
            let read = sys::wait_readable(&[receiver.as_fd()])
                .and_then(|_| sys::recv_with_fds(receiver.as_fd(), &mut buf, &mut fds));
            self.state().idle = false;
            match read {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("the close queue: {e}");
                    // Not a loop of warnings, should it last.
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
            fds.into_iter().for_each(close_emptied);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{io::Read, time::Duration};

    /// Whether the other end of `watched` closes within ten seconds.
    fn closes(mut watched: UnixStream) -> bool {
        watched
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        matches!(watched.read(&mut [0; 1]), Ok(0))
    }

    #[test]
    fn what_is_queued_is_closed() {
        let queue = CloseQueue::start().unwrap();
        let mut watched = Vec::new();
        for _ in 0..(SCM_MAX_FD * 2 + 7) {
            let (ours, queued) = UnixStream::pair().unwrap();
            queue.close(queued.into()).unwrap();
            watched.push(ours);
        }
        for ours in watched {
            assert!(closes(ours));
        }
    }
}
