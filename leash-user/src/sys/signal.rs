//! Signals taken from a descriptor (signalfd), and a stop of this process that waits for it.

use std::{
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

/// Stops this process with SIGTSTP, as the shell's Ctrl-Z would, and returns once it is
/// continued. Sent to the calling thread (raise), which then stops before it returns: sent to
/// the process (kill), it went to whichever thread the kernel chose, and the caller could run
/// on for a while before the stop reached it.
pub fn stop_until_continued() -> io::Result<()> {
    // SAFETY: raise takes a signal number and touches no memory of ours.
    if unsafe { libc::raise(libc::SIGTSTP) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Signals taken from a descriptor (signalfd) instead of by their default action: `leash run`
/// forwards them to its tree. They are blocked in the thread that makes it, and so in every
/// thread it starts later, and in every child it forks, unless [`SignalFd::unblock_in`].
pub struct SignalFd {
    fd: OwnedFd,
    set: libc::sigset_t,
}

impl SignalFd {
    /// Blocks `signals` and opens a non-blocking signalfd for them. Make it before any thread
    /// is started: one started earlier would still take them the default way.
    pub fn block(signals: &[i32]) -> io::Result<Self> {
        // SAFETY: a zeroed sigset is valid storage for sigemptyset; the set outlives the calls
        // that read it, and signalfd returns a new descriptor or -1.
        let (fd, set) = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for &signal in signals {
                if libc::sigaddset(&raw mut set, signal) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            let fd = libc::signalfd(-1, &raw const set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            (fd, set)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, set })
    }

    /// Unblocks the signals again in the child `command` forks, before it execs: a mask is
    /// inherited across fork and exec, and a command that could not be stopped by SIGTERM
    /// would be another command.
    pub fn unblock_in(&self, command: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let set = self.set;
        let unblock = move || -> io::Result<()> {
            // SAFETY: sigprocmask is async-signal-safe and allocates nothing; `set` is a copy
            // owned by the closure. The child has one thread, whose mask this is.
            if unsafe { libc::sigprocmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut()) }
                != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: the closure makes one async-signal-safe call and allocates nothing.
        unsafe { command.pre_exec(unblock) };
    }

    /// The next signal that came, if one did (never waits).
    pub fn take(&self) -> io::Result<Option<i32>> {
        // SAFETY: plain data; zeroed is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = size_of::<libc::signalfd_siginfo>();
        // SAFETY: info is valid for `size` bytes.
        let read = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut info).cast(), size) };
        match read {
            n if n == size as isize => Ok(i32::try_from(info.ssi_signo).ok()),
            -1 if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => Ok(None),
            -1 => Err(io::Error::last_os_error()),
            _ => Err(io::Error::other("a short read from a signalfd")),
        }
    }
}

impl AsFd for SignalFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
