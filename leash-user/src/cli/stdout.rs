//! Standard output for the commands that print: once its reader is gone (`leash ls | head`),
//! the command ends quietly, as ps and systemctl do, instead of saying `Broken pipe`.
//!
//! Rust ignores SIGPIPE, so a write to a pipe nobody reads fails with EPIPE. Restoring the
//! default disposition would end the command by the signal instead, but also on a write to
//! the daemon's socket after the daemon closed it, silently, where that deserves a message.
//! So the writes to stdout go through [`Stdout`], which notes an EPIPE of its own, and `main`
//! ends quietly when an error comes after one (`println!`, which panics on EPIPE, is denied in
//! the commands for the same reason).

use std::{
    io::{self, StdoutLock, Write},
    sync::atomic::{AtomicBool, Ordering},
};

/// Whether a write to stdout failed because its reader is gone.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Standard output, locked, noting a broken pipe.
pub(super) struct Stdout(StdoutLock<'static>);

/// Standard output, for as long as the command prints.
pub(super) fn lock() -> Stdout {
    Stdout(io::stdout().lock())
}

/// Whether stdout's reader is gone: a write to it failed with EPIPE.
pub(super) fn reader_gone() -> bool {
    READER_GONE.load(Ordering::Relaxed)
}

fn note<T>(result: io::Result<T>) -> io::Result<T> {
    if let Err(e) = &result
        && e.kind() == io::ErrorKind::BrokenPipe
    {
        READER_GONE.store(true, Ordering::Relaxed);
    }
    result
}

impl Stdout {
    /// Whether stdout is a terminal (for the width of `ls`'s lines).
    pub(super) fn is_terminal(&self) -> bool {
        io::IsTerminal::is_terminal(&self.0)
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        note(self.0.write(buf))
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        note(self.0.write_all(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        note(self.0.flush())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_broken_pipe_counts_as_the_reader_gone() {
        assert!(note(Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))).is_err());
        assert!(!reader_gone());
        assert!(note(Err::<(), _>(io::Error::from(io::ErrorKind::BrokenPipe))).is_err());
        assert!(reader_gone());
    }
}
