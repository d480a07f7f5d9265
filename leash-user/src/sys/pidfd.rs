//! Process file descriptors (pidfds), and the retry of calls that fail for a passing shortage
//! of descriptors or memory.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
};

/// A process file descriptor: names one process for good, so a signal sent through it can never
/// reach a process that later got the same pid.
pub struct Pidfd(pub(super) OwnedFd);

impl Pidfd {
    /// A pidfd for process `pid`. A shortage of descriptors or memory is waited out a little
    /// (see [`retry_on_shortage`]) and then returned as the error it is: it says nothing about
    /// the process, which only ESRCH (and EINVAL or ENOENT, for a thread's id) does.
    pub fn open(pid: u32) -> io::Result<Self> {
        retry_on_shortage(|| leash_client::sys::pidfd_open(pid).map(Self))
    }

    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: a valid pidfd, a signal number, no siginfo, no flags.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Pidfd {
    /// Whether the process has finished exiting (a zombie, or reaped): the pidfd polls
    /// readable then. Does not wait.
    pub fn has_exited(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, a zero timeout.
        let rc = unsafe { libc::poll(&mut poll, 1, 0) };
        rc == 1 && poll.revents & libc::POLLIN != 0
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Pidfd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// The errors that say the system or this process is short of something for now (file
/// descriptors: EMFILE, ENFILE; memory: ENOMEM, ENOBUFS), not that the call was wrong or its
/// object is gone.
pub fn is_shortage(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS)
    )
}

/// Pauses between the tries of [`retry_on_shortage`]: 15 ms in all.
const SHORTAGE_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(1),
    std::time::Duration::from_millis(2),
    std::time::Duration::from_millis(4),
    std::time::Duration::from_millis(8),
];

/// Runs `call` again, after a short pause, while it fails for a shortage (see
/// [`is_shortage`]): another task may close a descriptor or free memory meanwhile. The last
/// error when the shortage lasts. The pauses block the thread, 15 ms at most, and only while
/// descriptors or memory are short.
pub fn retry_on_shortage<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    for pause in SHORTAGE_PAUSES {
        match call() {
            Err(e) if is_shortage(&e) => std::thread::sleep(pause),
            done => return done,
        }
    }
    call()
}

impl Pidfd {
    /// Takes `fd` as a pidfd. The caller has checked that it is one (its fdinfo has a `Pid:`
    /// line); anything else fails where a pidfd is used, as EBADF or EINVAL.
    pub fn from_checked(fd: OwnedFd) -> Self {
        Self(fd)
    }
}

impl From<Pidfd> for OwnedFd {
    fn from(pidfd: Pidfd) -> Self {
        pidfd.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortage_is_retried_and_then_returned() {
        let mut calls = 0;
        let result: io::Result<()> = retry_on_shortage(|| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::EMFILE))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EMFILE));
        assert_eq!(calls, SHORTAGE_PAUSES.len() + 1);

        let mut calls = 0;
        let result = retry_on_shortage(|| {
            calls += 1;
            match calls {
                1 => Err(io::Error::from_raw_os_error(libc::ENFILE)),
                _ => Ok(calls),
            }
        });
        assert_eq!(result.unwrap(), 2, "succeeds once descriptors are back");
    }

    #[test]
    fn other_errors_are_returned_at_once() {
        let mut calls = 0;
        let result: io::Result<()> = retry_on_shortage(|| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::ESRCH))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ESRCH));
        assert_eq!(calls, 1);
    }
}
