//! The one module of leash-user that calls the kernel through `unsafe`: thin wrappers with
//! safe signatures. Everything else is safe code. (The host library has its own, for the one
//! call hosts need: starting a process held before exec.)

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
};

pub use leash_client::sys::{SpawnHeldError, spawn_held};

/// mount -t tracefs tracefs TARGET
pub fn mount_tracefs(target: &Path) -> io::Result<()> {
    let source = c"tracefs";
    let target = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            source.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A process file descriptor: names one process for good, so a signal sent through it can never
/// reach a process that later got the same pid.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    pub fn open(pid: u32) -> io::Result<Self> {
        let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd, and nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
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
