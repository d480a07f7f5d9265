//! The system call std does not wrap.

/// Ignores SIGPIPE from now on: a write to a closed pipe or socket fails with EPIPE instead.
pub fn ignore_sigpipe() {
    // SAFETY: signal(2) with SIG_IGN installs no handler code; it only changes this process's
    // disposition of SIGPIPE, which nothing in this process relies on.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
