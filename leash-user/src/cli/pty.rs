//! `leash run` at a terminal: the command gets a pseudoterminal of its own, relayed to and from
//! the user's terminal (as sudo's `use_pty` does). What the command pushes into its terminal's
//! input (ioctl TIOCSTI, where the kernel still allows it) then reaches only that pty, never the
//! user's shell, which would run it once `leash run` returns, outside any tree.
//!
//! The user's terminal is in raw mode while the relay runs, so that every key goes to the pty,
//! whose line discipline makes of it what the user's terminal would have: Ctrl-C interrupts
//! the command, not `leash run`. It is restored on every way out of `leash run` (the relay is
//! a guard, and the signals `leash run` takes come on a signalfd, not by their default action).
//!
//! The command leads a session of its own, so its process group is orphaned: the kernel does
//! not stop it for Ctrl-Z (nor for its own SIGTSTP). So the relay stops it itself: the pty's
//! suspend key, where the pty would have the kernel send SIGTSTP to the command's group and
//! the command leaves SIGTSTP to its default action, is not passed on; the group gets SIGSTOP
//! instead (which a program cannot catch to tidy its screen first: it redraws when continued).
//! Stopped, however that came (SIGSTOP from elsewhere too), the command stops `leash run`, the
//! terminal in its own mode, and `fg` continues both. A job of a shell run in the pty has that
//! shell for a parent, in its session: the kernel stops it as on any terminal, and the key is
//! passed on. The command's exit hangs the pty up, as a session leader's does its terminal:
//! what is left in its foreground process group gets SIGHUP (sudo avoids this with a monitor
//! process that leads the session).

use std::{
    fs::File,
    io::{self, PipeReader, PipeWriter, Read, Write},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    process::{Child, Command, Stdio},
    sync::Arc,
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use leash::sys::{SignalFd, controlling_terminal_in, open_pty};
use rustix::{
    event::{PollFd, PollFlags, Timespec, poll},
    process::{Pid, Signal, WaitId, WaitIdOptions, kill_process_group, waitid},
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
    /// SIGWINCH (the user's terminal changed size) and SIGCHLD (the command may have
    /// stopped), taken from a descriptor.
    signals: SignalFd,
}

impl Pty {
    /// Opens the pty with the user's terminal's settings and size. Call it before any thread
    /// starts (SIGWINCH and SIGCHLD are blocked here, see [`SignalFd::block`]).
    pub(super) fn open() -> Result<Self> {
        let signals = SignalFd::block(&[libc::SIGWINCH, libc::SIGCHLD])
            .context("taking SIGWINCH and SIGCHLD")?;
        let (master, other) = open_pty().context(
            "opening a pseudoterminal for the command (--no-pty lets it share this terminal)",
        )?;
        let stdin = rustix::stdio::stdin();
        // The command starts with the terminal as the user has set it (erase key, UTF-8...).
        let settings = termios::tcgetattr(stdin).context("reading the terminal's settings")?;
        termios::tcsetattr(&other, OptionalActions::Now, &settings)
            .context("setting up the pseudoterminal")?;
        copy_size(stdin, master.as_fd());
        Ok(Self {
            master,
            other,
            signals,
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
        self.signals.unblock_in(command);
        controlling_terminal_in(command);
        Ok(())
    }

    /// Starts relaying, once the command `root` is spawned and `command`, with its copies of
    /// the pty, is dropped: then the pty reports its end when the last process holding it
    /// exits.
    pub(super) fn relay(self, root: &Child) -> Relay {
        drop(self.other);
        let mode = Mode::raw_if_foreground();
        let foreground = mode.saved.is_some();
        let (stop_read, stop_write) = match io::pipe() {
            Ok(ends) => ends,
            Err(error) => {
                tracing::warn!("no pipe to stop the terminal relay: {error}");
                return Relay {
                    stop: None,
                    output: None,
                };
            }
        };
        let master = Arc::new(File::from(self.master));
        let stop = Arc::new(stop_read);
        // In the background the terminal's input is the foreground job's: a read would stop
        // `leash run` with SIGTTIN.
        let root = Pid::from_child(root);
        let input = foreground.then(|| {
            let (master, stop) = (Arc::clone(&master), Arc::clone(&stop));
            thread::Builder::new()
                .name("leash-pty-in".into())
                .spawn(move || relay_input(&master, &stop, root))
        });
        if let Some(Err(error)) = input {
            tracing::warn!("the terminal's input is not relayed: {error}");
        }
        let output = Output {
            master,
            signals: self.signals,
            stop,
            mode,
            root,
        };
        let output = thread::Builder::new()
            .name("leash-pty-out".into())
            .spawn(move || output.relay())
            .inspect_err(|error| tracing::warn!("the command's output is not relayed: {error}"))
            .ok();
        Relay {
            stop: Some(stop_write),
            output,
        }
    }
}

/// The relay between the user's terminal and the command's pty. [`Relay::finish`], or dropping
/// it, drains the command's last output and gives the terminal back its mode.
pub(super) struct Relay {
    /// Closed to stop the relay's threads.
    stop: Option<PipeWriter>,
    /// The thread that relays the output, and holds the terminal's mode.
    output: Option<JoinHandle<()>>,
}

impl Relay {
    /// The tree has ended: copies what output it left in the pty, and restores the terminal.
    /// The input thread is left blocked where it is: the process is about to exit.
    pub(super) fn finish(&mut self) {
        self.stop = None;
        if let Some(output) = self.output.take() {
            let _ = output.join();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The user's terminal's mode while relaying: raw, restored when dropped.
struct Mode {
    /// The terminal's mode before raw mode, to restore; None if it was left as it was.
    saved: Option<Termios>,
}

impl Mode {
    /// Raw mode, if `leash run` is in the terminal's foreground: in the background, the
    /// terminal is the foreground job's, and its mode is not ours to change.
    fn raw_if_foreground() -> Self {
        let stdin = rustix::stdio::stdin();
        let foreground =
            termios::tcgetpgrp(stdin).is_ok_and(|group| group == rustix::process::getpgrp());
        Self {
            saved: foreground.then(|| raw_mode(stdin)).flatten(),
        }
    }

    fn restore(&mut self) {
        if let Some(saved) = self.saved.take() {
            // Now, not once the output is drained: a terminal stopped by Ctrl-S would hold a
            // drain, and `leash run` with it.
            if let Err(error) =
                termios::tcsetattr(rustix::stdio::stdin(), OptionalActions::Now, &saved)
            {
                tracing::debug!("restoring the terminal's mode: {error}");
            }
        }
    }
}

impl Drop for Mode {
    fn drop(&mut self) {
        self.restore();
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

/// Keys from the user's terminal to the pty, until `stop` is closed or either side ends. The
/// suspend key that the kernel would drop stops the command `root`'s group instead (see the
/// module doc).
fn relay_input(master: &File, stop: &PipeReader, root: Pid) {
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
        let mut keys = &buffer[..read];
        while let Some(at) = dropped_suspend_key(master, root, keys) {
            if (&*master).write_all(&keys[..at]).is_err() {
                return;
            }
            if let Err(error) = kill_process_group(root, Signal::STOP) {
                tracing::debug!("stopping the command: {error}");
            }
            keys = &keys[at + 1..];
        }
        if (&*master).write_all(keys).is_err() {
            return;
        }
    }
}

/// Where in `keys` the pty's suspend key is, if the kernel would drop the SIGTSTP it makes:
/// the pty sends it (ISIG, a suspend key set) to the command `root`'s process group, its
/// foreground one, which is orphaned, and `root` leaves SIGTSTP to its default action, which
/// the kernel ignores in an orphaned group. (Caught or ignored, the key is passed on: the
/// kernel delivers a caught one.)
fn dropped_suspend_key(master: &File, root: Pid, keys: &[u8]) -> Option<usize> {
    let settings = termios::tcgetattr(master).ok()?;
    let suspend = settings.special_codes[termios::SpecialCodeIndex::VSUSP];
    if !settings.local_modes.contains(termios::LocalModes::ISIG) || suspend == 0 {
        return None;
    }
    let at = keys.iter().position(|&key| key == suspend)?;
    let foreground = termios::tcgetpgrp(master).ok()?;
    (foreground == root && tstp_is_default(root)).then_some(at)
}

/// Whether process `pid` neither ignores nor catches SIGTSTP, from /proc/PID/status.
fn tstp_is_default(pid: Pid) -> bool {
    let tstp = 1u64 << (libc::SIGTSTP - 1);
    procfs::process::Process::new(pid.as_raw_nonzero().get())
        .and_then(|process| process.status())
        .is_ok_and(|status| (status.sigign | status.sigcgt) & tstp == 0)
}

/// The output side of the relay, on a thread of its own: the command's output from the pty to
/// the user's terminal, the terminal's size to the pty, and the command's stops to the shell.
struct Output {
    master: Arc<File>,
    /// SIGWINCH and SIGCHLD.
    signals: SignalFd,
    stop: Arc<PipeReader>,
    mode: Mode,
    /// The command: a session leader, its process group's leader.
    root: Pid,
}

impl Output {
    /// Relays until the pty ends (no process holds it any more) or, once `stop` is closed,
    /// until the output left in it is drained; then the terminal gets its mode back.
    fn relay(mut self) {
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
                PollFd::new(&*self.master, PollFlags::IN),
                PollFd::new(&self.signals, PollFlags::IN),
                PollFd::new(&*self.stop, PollFlags::IN),
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
            let (output, signals) = (
                !polls[0].revents().is_empty(),
                !polls[1].revents().is_empty(),
            );
            let stopped = watched == 3 && !polls[2].revents().is_empty();
            if output {
                match (&*self.master).read(&mut buffer) {
                    // EIO: no process holds the pty any more, and all it wrote has been read.
                    Ok(0) => return,
                    Ok(read) => {
                        // A terminal that is gone still has its output read, or the command
                        // would block writing it.
                        if let Err(error) = out.write_all(&buffer[..read]) {
                            tracing::debug!("writing the command's output: {error}");
                        }
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
            if signals {
                self.signalled();
            }
            if stopped {
                draining = Some(Instant::now() + DRAIN_AT_MOST);
            }
        }
    }

    /// SIGWINCH: the terminal's new size to the pty. SIGCHLD: if the command stopped (Ctrl-Z
    /// in the pty), `leash run` stops as well, the terminal in its own mode, so that the
    /// user's shell takes it back; continued (`fg`), it continues the command.
    fn signalled(&mut self) {
        while let Ok(Some(_)) = self.signals.take() {}
        let stopped = waitid(
            WaitId::Pid(self.root),
            WaitIdOptions::STOPPED | WaitIdOptions::NOHANG,
        );
        if let Ok(Some(status)) = stopped {
            tracing::debug!(signal = status.stopping_signal(), "the command stopped");
            self.mode.restore();
            if let Err(error) = leash::sys::stop_until_continued() {
                tracing::debug!("stopping with the command: {error}");
            }
            self.mode = Mode::raw_if_foreground();
            if let Err(error) = kill_process_group(self.root, Signal::CONT) {
                tracing::debug!("continuing the command: {error}");
            }
        }
        copy_size(rustix::stdio::stdin(), self.master.as_fd());
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
