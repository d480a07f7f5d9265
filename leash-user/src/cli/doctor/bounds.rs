//! How each check runs: on a thread of its own, waited for a bounded time (a daemon that takes
//! the connection and never answers, or a hung file system, must not hang the doctor).

use std::{sync::mpsc, thread, time::Duration};

use super::report::{Finding, Status};

/// How long the daemon has to answer, and any other check to finish.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);
/// How long the probes that load BPF (and parse the kernel's BTF) may take.
pub(super) const BPF_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `check` on a thread of its own and waits `timeout` for it: None if it did not finish
/// (the thread is left to end with the process).
pub(super) fn bounded<T: Send + 'static>(
    timeout: Duration,
    check: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(check());
    });
    rx.recv_timeout(timeout).ok()
}

pub(super) fn timed_out(name: &'static str) -> Finding {
    Finding::new(
        name,
        Status::Fail,
        format!("the check did not finish within {} s", TIMEOUT.as_secs()),
    )
    .with_fix("run it again; if it hangs again, look at what blocks (a hung file system?)")
}

pub(super) fn is_root() -> bool {
    leash::sys::effective_uid() == 0
}

pub(super) const NEEDS_ROOT_FIX: &str = "run `sudo leash doctor` to check it";
