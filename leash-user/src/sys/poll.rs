//! Waiting for descriptors to be readable: blocking (poll), or through tokio's reactor.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
};

use tokio::io::{Interest, unix::AsyncFd};

/// Waits until one of `fds` is readable; returns the index of the first that is.
pub fn wait_readable(fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `polls` is valid for its length; no timeout.
        let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if rc < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if let Some(ready) = polls.iter().position(|p| p.revents != 0) {
            return Ok(ready);
        }
    }
}

/// Registers an owned descriptor with tokio's reactor, to await its readability (a pidfd
/// polls readable when its process exits; a ring buffer when records wait).
pub fn async_readable<T: Into<OwnedFd>>(fd: T) -> io::Result<AsyncFd<OwnedFd>> {
    let fd: OwnedFd = fd.into();
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open and is never replaced until the
    // AsyncFd is dropped, so as_raw_fd always returns the same open descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}
