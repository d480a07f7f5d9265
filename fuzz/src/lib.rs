//! What the `connection` fuzz target runs around the daemon: the daemon itself in this process,
//! an unprivileged relay process that makes every connection to it, a janitor process that
//! removes the daemon's directory when this process is gone, and the checks on what the daemon
//! answers.
//!
//! - [`harness`]: one fuzz input, from the relay's conversation to the checks.
//! - [`daemon`]: the real daemon core on a socket in a fresh directory.
//! - [`relay`]: the connections, made as an unprivileged uid.
//! - [`replies`]: what must hold of the daemon's answer to any input.
//! - [`janitor`]: cleanup that outlives this process.
//! - [`credentials`]: whose process is whose, as /proc says.
//! - `sys`: the one system call std does not wrap.

pub mod credentials;
pub mod daemon;
pub mod harness;
pub mod janitor;
pub mod relay;
pub mod replies;
mod sys;

/// Names the role a copy of the fuzz binary was started for (see [`prepare_process`]).
const ROLE_VAR: &str = "LEASH_FUZZ_ROLE";

/// The first thing the `connection` target does in a process. The relay and the janitor are
/// this same binary started again (a fresh process can drop its privileges and be anything,
/// where a fork of this multi-threaded one could not): when this process is one of them, it
/// does that job and exits here, before libFuzzer starts. Otherwise it ignores SIGPIPE, as the
/// `leash` binary does (Rust's own `main` would), so a client that goes away is an error on
/// the daemon's write and not the end of the process.
pub fn prepare_process() {
    sys::ignore_sigpipe();
    match std::env::var(ROLE_VAR).as_deref() {
        Ok(relay::ROLE) => relay::serve(),
        Ok(janitor::ROLE) => janitor::serve(),
        _ => {}
    }
}

/// The start of `bytes`, readable, for a failure message.
pub(crate) fn preview(bytes: &[u8]) -> String {
    const SHOWN: usize = 600;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)]).into_owned();
    if bytes.len() > SHOWN {
        format!("{text}... ({} bytes in all)", bytes.len())
    } else {
        text
    }
}
