//! `leash run` at a terminal: the command gets a pseudoterminal of its own, relayed to and from
//! the user's terminal (as sudo's `use_pty` does). What the command pushes into its terminal's
//! input (ioctl TIOCSTI, where the kernel still allows it) then reaches only that pty, never the
//! user's shell, which would run it once `leash run` returns, outside any tree.
//!
//! The user's terminal is in raw mode while the relay runs, so that every key, Ctrl-C and
//! Ctrl-Z among them, goes to the pty, whose line discipline makes of it what the user's
//! terminal would have; it is restored when the relay is dropped, on every way out of
//! `leash run` (the signals it takes come on a signalfd, not by their default action).

use std::{
    fs::File,
    io::{self, PipeReader, PipeWriter, Read, Write},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    process::{Command, Stdio},
    sync::Arc,
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use leash::sys::{SignalFd, controlling_terminal_in, open_pty};
use rustix::{
    event::{PollFd, PollFlags, Timespec, poll},
    termios::{self, OptionalActions, Termios},
};

/// Once the tree has ended, how long output still queued in the pty is waited for: until the
/// pty says no process holds it any more, a pause this long, or [`DRAIN_AT_MOST`].
const DRAIN_PAUSE: Duration = Duration::from_millis(200);
const DRAIN_AT_MOST: Duration = Duration::from_secs(2);

/// Whether `leash run` relays through a pty: only when its standard input is a terminal
/// (pipes and files are passed as they are).
pub(super) fn wanted() -> bool {
    termios::isatty(rustix::stdio::stdin())
}

/// A pty made for the command, not yet relayed.
pub(super) struct Pty {
    master: OwnedFd,
    other: OwnedFd,
    /// SIGWINCH, taken from a descriptor: the user's terminal changed size.
    resized: SignalFd,
}

impl Pty {
    /// Opens the pty with the user's terminal's settings and size. Call it before any thread
    /// starts (SIGWINCH is blocked here, see [`SignalFd::block`]).
    pub(super) fn open() -> Result<Self> {
        let resized = SignalFd::block(&[libc::SIGWINCH]).context("taking SIGWINCH")?;
        let (master, other) = open_pty().context("opening a pseudoterminal")?;
        let stdin = rustix::stdio::stdin();
        // The command starts with the terminal as the user has set it (erase key, UTF-8...).
        let settings = termios::tcgetattr(stdin).context("reading the terminal's settings")?;
        termios::tcsetattr(&other, OptionalActions::Now, &settings)
            .context("setting up the pseudoterminal")?;
        copy_size(stdin, master.as_fd());
        Ok(Self {
            master,
            other,
            resized,
        })
    }

    /// Gives `command` the pty: as its standard input, its standard output and error where
    /// they are terminals too (a redirected one stays as it is), and as its controlling
    /// terminal, in a session of its own.
    pub(super) fn attach(&self, command: &mut Command) -> Result<()> {
        let end = || -> Result<Stdio> {
            Ok(Stdio::from(
                self.other.try_clone().context("duplicating the pty")?,
            ))
        };
        command.stdin(end()?);
        if termios::isatty(rustix::stdio::stdout()) {
            command.stdout(end()?);
        }
        if termios::isatty(rustix::stdio::stderr()) {
            command.stderr(end()?);
        }
        self.resized.unblock_in(command);
        controlling_terminal_in(command);
        Ok(())
    }

    /// Starts relaying, once the command is spawned and `command`, with its copies of the
    /// pty, is dropped: then the pty reports its end when the last process holding it exits.
    pub(super) fn relay(self) -> Relay {
        drop(self.other);
        let stdin = rustix::stdio::stdin();
        // In the background, the terminal is the foreground job's: its mode is not ours to
        // change, nor its input to read (the read would stop `leash run` with SIGTTIN).
        let foreground =
            termios::tcgetpgrp(stdin).is_ok_and(|group| group == rustix::process::getpgrp());
        let saved = foreground.then(|| raw_mode(stdin)).flatten();
        let (stop_read, stop_write) = match io::pipe() {
            Ok(ends) => ends,
            Err(error) => {
                tracing::warn!("no pipe to stop the terminal relay: {error}");
                return Relay::idle(saved);
            }
        };
        let master = Arc::new(File::from(self.master));
        let stop = Arc::new(stop_read);
        let input = foreground.then(|| {
            let (master, stop) = (Arc::clone(&master), Arc::clone(&stop));
            thread::Builder::new()
                .name("leash-pty-in".into())
                .spawn(move || relay_input(&master, &stop))
        });
        if let Some(Err(error)) = input {
            tracing::warn!("the terminal's input is not relayed: {error}");
        }
        let output = thread::Builder::new()
            .name("leash-pty-out".into())
            .spawn(move || relay_output(&master, &self.resized, &stop));
        let output = output
            .inspect_err(|error| tracing::warn!("the command's output is not relayed: {error}"))
            .ok();
        Relay {
            saved,
            stop: Some(stop_write),
            output,
        }
    }
}

/// The relay between the user's terminal and the command's pty. [`Relay::finish`], or dropping
/// it, drains the command's last output and gives the terminal back its mode.
pub(super) struct Relay {
    /// The terminal's mode before raw mode, to restore; None if it was left as it was.
    saved: Option<Termios>,
    /// Closed to stop the relay's threads.
    stop: Option<PipeWriter>,
    output: Option<JoinHandle<()>>,
}

impl Relay {
    fn idle(saved: Option<Termios>) -> Self {
        Self {
            saved,
            stop: None,
            output: None,
        }
    }

    /// The tree has ended: copies what output it left in the pty, and restores the terminal.
    /// The input thread is left blocked where it is: the process is about to exit.
    pub(super) fn finish(&mut self) {
        self.stop = None;
        if let Some(output) = self.output.take() {
            let _ = output.join();
        }
        if let Some(saved) = self.saved.take() {
            // Now, not after the output drains: a terminal stopped by Ctrl-S would hold a
            // drain, and `leash run` with it.
            if let Err(error) =
                termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Now, &saved)
            {
                tracing::debug!("restoring the terminal's mode: {error}");
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Puts `terminal` in raw mode; returns its mode before, or None if it could not be changed
/// (then it is relayed as it is: the pty's line discipline does the rest).
fn raw_mode(terminal: BorrowedFd<'_>) -> Option<Termios> {
    let saved = termios::tcgetattr(terminal)
        .inspect_err(|error| tracing::debug!("reading the terminal's mode: {error}"))
        .ok()?;
    let mut raw = saved.clone();
    raw.make_raw();
    // Drain: what was written in the terminal's mode before is shown in that mode.
    match termios::tcsetattr(terminal, OptionalActions::Drain, &raw) {
        Ok(()) => Some(saved),
        Err(error) => {
            tracing::debug!("setting the terminal's raw mode: {error}");
            None
        }
    }
}

/// The user's terminal's size, given to the pty: the command gets SIGWINCH from it when it
/// changes.
fn copy_size(terminal: BorrowedFd<'_>, pty: BorrowedFd<'_>) {
    let copied = termios::tcgetwinsize(terminal).and_then(|size| termios::tcsetwinsize(pty, size));
    if let Err(error) = copied {
        tracing::debug!("copying the terminal's size: {error}");
    }
}

/// Keys from the user's terminal to the pty, until `stop` is closed or either side ends.
fn relay_input(master: &File, stop: &PipeReader) {
    let stdin = rustix::stdio::stdin();
    let mut buffer = [0u8; 4096];
    loop {
        let mut polls = [
            PollFd::new(&stdin, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut polls, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        if !polls[1].revents().is_empty() {
            return;
        }
        if polls[0].revents().is_empty() {
            continue;
        }
        let read = match rustix::io::read(stdin, &mut buffer) {
            Ok(0) => return,
            Ok(read) => read,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
            Err(_) => return,
        };
        if (&*master).write_all(&buffer[..read]).is_err() {
            return;
        }
    }
}

/// The command's output from the pty to the user's terminal, and the terminal's size to the
/// pty, until the pty ends (no process holds it any more) or, once `stop` is closed, until
/// the output left in it is drained.
fn relay_output(master: &File, resized: &SignalFd, stop: &PipeReader) {
    let mut out = output_terminal();
    let mut buffer = [0u8; 4096];
    // Set once stopped: the end of the drain, at the latest.
    let mut draining: Option<Instant> = None;
    loop {
        let timeout = draining.map(|until| {
            let pause = DRAIN_PAUSE.min(until.saturating_duration_since(Instant::now()));
            Timespec {
                tv_sec: 0,
                tv_nsec: i64::from(pause.subsec_nanos()),
            }
        });
        let mut polls = [
            PollFd::new(master, PollFlags::IN),
            PollFd::new(resized, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        // Once stopped, the stop pipe (closed, so always ready) is left out.
        let watched = if draining.is_some() { 2 } else { 3 };
        match poll(&mut polls[..watched], timeout.as_ref()) {
            // A pause in the output while draining: what the tree wrote has all come.
            Ok(0) if draining.is_some() => return,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        if draining.is_some_and(|until| Instant::now() >= until) {
            return;
        }
        if !polls[0].revents().is_empty() {
            match (&*master).read(&mut buffer) {
                // EIO: no process holds the pty any more, and all it wrote has been read.
                Ok(0) => return,
                Ok(read) => {
                    // A terminal that is gone still has its output read, or the command would
                    // block writing it.
                    if let Err(error) = out.write_all(&buffer[..read]) {
                        tracing::debug!("writing the command's output: {error}");
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        if !polls[1].revents().is_empty() {
            while let Ok(Some(_)) = resized.take() {}
            copy_size(rustix::stdio::stdin(), master.as_fd());
        }
        if draining.is_none() && !polls[2].revents().is_empty() {
            draining = Some(Instant::now() + DRAIN_AT_MOST);
        }
    }
}

/// Where the command's output goes: the user's terminal, by the first of standard output and
/// error that is one; else the terminal on standard input, opened again to write (the echo of
/// what is typed is shown there).
fn output_terminal() -> Box<dyn Write> {
    let duplicate = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().ok().map(File::from);
    let (stdout, stderr) = (rustix::stdio::stdout(), rustix::stdio::stderr());
    let found = if termios::isatty(stdout) {
        duplicate(stdout)
    } else if termios::isatty(stderr) {
        duplicate(stderr)
    } else {
        File::options().write(true).open("/proc/self/fd/0").ok()
    };
    match found.or_else(|| duplicate(stdout)) {
        Some(file) => Box::new(file),
        None => Box::new(io::sink()),
    }
}
