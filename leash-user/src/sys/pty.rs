//! A pseudoterminal of its own for `leash run`'s command: opening one, and making it the
//! command's controlling terminal between fork and exec.

use std::{
    io,
    os::{
        fd::{BorrowedFd, OwnedFd},
        unix::process::CommandExt,
    },
    process::Command,
};

use rustix::pty::OpenptFlags;

/// Opens a pseudoterminal: its master side, kept by the caller, and its other side, given to
/// the command. Both close-on-exec; neither becomes this process's controlling terminal.
pub fn open_pty() -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    // The other side opened through the master (TIOCGPTPEER), not by its name under /dev/pts:
    // no other process can swap the name between the two.
    let other = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
    Ok((master, other))
}

/// Makes the command `command` forks a session leader whose controlling terminal is its
/// standard input, which must be the pty's other side (`Command::stdin`): so the pty's line
/// discipline delivers Ctrl-C and Ctrl-Z to the command, and the user's terminal is not the
/// command's at all.
pub fn controlling_terminal_in(command: &mut Command) {
    let take_terminal = || -> io::Result<()> {
        rustix::process::setsid()?;
        // SAFETY: descriptor 0 is open: std has already made the command's stdin (the pty) its
        // descriptor 0 when the pre_exec closures run, and this borrow ends with the call.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        rustix::process::ioctl_tiocsctty(stdin)?;
        Ok(())
    };
    // SAFETY: the closure makes two system calls (rustix calls the kernel directly: no lock, no
    // allocation) and captures nothing; both are async-signal-safe.
    unsafe { command.pre_exec(take_terminal) };
}
