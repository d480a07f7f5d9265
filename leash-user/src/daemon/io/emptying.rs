//! Closing one descriptor a client sent so that its close waits on as little as it can. A
//! socket is made abortive (`SO_LINGER` 0 s): a TCP socket lingering on a send queue its peer
//! never reads is reset rather than waited out. A Unix socket is shut down, so its peer can
//! queue nothing more, and emptied first: what is queued on it is taken out and closed the
//! same way, and so are the connections waiting on a listening one, down to [`DEPTH`]
//! sockets deep. Without that, its last close would release what it holds, a lingering
//! socket among them, and no option set on the outer socket reaches those inside.
//!
//! What can still wait: a file whose own close does (a FUSE file flushes to its server; a file
//! on a network filesystem to the network), and whatever sits deeper than [`DEPTH`]. The
//! disposal bounds what waits behind such a close (see `disposal`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::sys;

/// How many Unix sockets deep what is queued is taken out before a close.
pub(in crate::daemon) const DEPTH: usize = 4;
/// Messages taken out of one socket, and connections from one listening socket, at most: a
/// shut-down socket is queued nothing more, so this only bounds the work on a full one.
const MESSAGES: usize = 4096;

/// Closes `fd` as the module doc says.
pub(in crate::daemon) fn close_emptied(fd: OwnedFd) {
    close_at(fd, DEPTH);
}

fn close_at(fd: OwnedFd, depth: usize) {
    // Not a socket (ENOTSOCK): nothing to make abortive.
    let _ = sys::set_abortive_close(fd.as_fd());
    if depth > 0 && sys::is_unix_socket(fd.as_fd()) {
        // A listening socket cannot be shut down on every kernel; its waiting connections
        // are taken out all the same.
        let _ = sys::shutdown(fd.as_fd());
        empty(fd.as_fd(), depth - 1);
    }
    drop(fd);
}

/// Takes out and closes (at `depth`) what is queued on the Unix socket `socket`: the
/// descriptors of its messages, and the connections waiting on it if it listens.
fn empty(socket: BorrowedFd<'_>, depth: usize) {
    let mut buf = vec![0; 4096];
    for _ in 0..MESSAGES {
        let mut fds = Vec::new();
        let read = sys::recv_with_fds(socket, &mut buf, &mut fds);
        let more = matches!(read, Ok(read) if read > 0);
        for fd in fds {
            close_at(fd, depth);
        }
        // Ended (0 once shut down and empty), nothing waits (EAGAIN), or not one to read
        // from (a listening socket). A read whose control data was cut short has had the
        // kernel close what did not fit; what did arrive is closed above, and nothing follows.
        if !more {
            break;
        }
    }
    for _ in 0..MESSAGES {
        let Ok(connection) = sys::accept_waiting(socket) else {
            break;
        };
        close_at(connection, depth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{io::Read, os::unix::net::UnixStream};

    /// One end of a socket pair queued `levels` Unix sockets deep; returns the outermost
    /// socket and the other end, which reads end of file once the queued end is closed.
    fn nested(levels: usize) -> (OwnedFd, UnixStream) {
        let (watched, queued) = UnixStream::pair().unwrap();
        let mut inner = OwnedFd::from(queued);
        for _ in 0..levels {
            let (holder, sender) = UnixStream::pair().unwrap();
            sys::send_fds(sender.as_fd(), &[inner.as_fd()]).unwrap();
            inner = holder.into();
        }
        (inner, watched)
    }

    /// Whether the other end of `watched` is closed (without waiting: open, it reads nothing).
    fn closed(mut watched: UnixStream) -> bool {
        watched.set_nonblocking(true).unwrap();
        matches!(watched.read(&mut [0; 1]), Ok(0))
    }

    #[test]
    fn what_is_queued_is_taken_out_down_to_the_depth() {
        for levels in [1, DEPTH + 1] {
            let (outer, watched) = nested(levels);
            // Another descriptor of the outer socket stays open: its close releases nothing,
            // so only the emptying can have closed what was queued.
            let kept = outer.try_clone().unwrap();
            close_emptied(outer);
            assert!(closed(watched), "{levels} deep");
            drop(kept);
        }
    }

    #[test]
    fn a_socket_is_shut_down_so_its_peer_queues_nothing_more() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (_reader, writer) = std::io::pipe().unwrap();
        let ours: OwnedFd = ours.into();
        let kept = ours.try_clone().unwrap();
        close_emptied(ours);
        let sent = sys::send_fds(theirs.as_fd(), &[writer.as_fd()]);
        assert_eq!(sent.map_err(|e| e.raw_os_error()), Err(Some(libc::EPIPE)));
        drop(kept);
    }

    #[test]
    fn connections_waiting_on_a_listening_socket_are_emptied_too() {
        let dir = std::env::temp_dir().join(format!("leash-emptying-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("listening.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let (watched, queued) = UnixStream::pair().unwrap();
        sys::send_fds(client.as_fd(), &[queued.as_fd()]).unwrap();
        drop(queued);
        // The client's end stays open: only the waiting connection's emptying closes the pipe.
        let listener: OwnedFd = listener.into();
        let kept = listener.try_clone().unwrap();
        close_emptied(listener);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(closed(watched));
        drop((kept, client));
    }
}
