//! The one module of leash-client that uses `unsafe`: starting a process held between fork and
//! exec, handing a descriptor to a child, taking over an inherited one, and naming a process to
//! the daemon by a pidfd sent over its socket. Between fork and
//! exec only async-signal-safe calls are made, and nothing is allocated.

use std::{
    io::{self, Read, Write},
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::{net::UnixStream, process::CommandExt},
    },
    process::{Child, Command},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
};

/// The byte the parent sends a held child: go on to exec, or give up.
const GO: u8 = 1;
const NO_GO: u8 = 0;

/// Spawns `command` held between fork and exec: the child reports its pid, `register` runs
/// (on another thread, while this one waits in `spawn`), and only if it succeeds does the child
/// go on to exec. So the process is registered before it runs one instruction of the command.
/// If `register` fails the child exits without running the command, it is reaped, and the
/// error is returned.
///
/// `command` cannot be spawned again afterwards: its hold refers to pipes that are gone, so a
/// second spawn fails in the child instead of running anything unregistered.
pub fn spawn_held<E: Send>(
    command: &mut Command,
    register: impl FnOnce(u32) -> Result<(), E> + Send,
) -> Result<Child, SpawnHeldError<E>> {
    let (mut pid_from_child, pid_to_parent) = io::pipe()?;
    let (go_from_parent, mut go_to_child) = io::pipe()?;
    let (write_fd, read_fd) = (pid_to_parent.as_raw_fd(), go_from_parent.as_raw_fd());
    // The parent's ends, which the child inherits at fork (CLOEXEC closes them only at exec).
    let (parents_read_fd, parents_write_fd) = (pid_from_child.as_raw_fd(), go_to_child.as_raw_fd());
    let armed = Arc::new(AtomicBool::new(true));
    let armed_in_child = Arc::clone(&armed);
    let hold = move || -> io::Result<()> {
        // Only async-signal-safe calls between fork and exec (close, getpid, write, read), and
        // no allocation: io::Error::from_raw_os_error and last_os_error allocate nothing.
        if !armed_in_child.load(Ordering::Relaxed) {
            // A later spawn of the same Command: these fd numbers may name anything now.
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        }
        // SAFETY: the four fds are open in the child: the parent keeps them open until spawn
        // returns, and the hold is disarmed before they close. Closing the parent's ends
        // touches only this child's fd table. The buffers are valid for their lengths.
        unsafe {
            // First, the parent's ends. The parent answers GO or NO_GO, but if it cannot (its
            // registrar panicked) only the end of the go pipe tells, and this child's own copy
            // of the write end would keep the pipe open: the read below would never return,
            // and spawn, waiting for this child, neither.
            libc::close(parents_write_fd);
            libc::close(parents_read_fd);
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(write_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(io::Error::last_os_error());
            }
            let mut go = NO_GO;
            if libc::read(read_fd, (&raw mut go).cast(), 1) != 1 || go != GO {
                // Not registered, so not started. spawn reports this errno; the caller
                // reports the registration's error instead.
                return Err(io::Error::from_raw_os_error(libc::ECANCELED));
            }
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls and allocates nothing (see above).
    unsafe { command.pre_exec(hold) };

    let result = thread::scope(|scope| {
        // A thread of its own can fail to start (RLIMIT_NPROC counts threads, the user's
        // processes may have used them all): an error to report, not a panic. Nothing was
        // forked yet, so nothing is left to clean up.
        let registrar = thread::Builder::new()
            .name("leash-register".into())
            .spawn_scoped(scope, move || {
                let mut pid = [0u8; 4];
                // End of file: the child never reached the gate (spawn failed before it).
                pid_from_child.read_exact(&mut pid).ok()?;
                let registered = register(u32::from_ne_bytes(pid));
                // An explicit answer either way, not only the end of the pipe: a child another
                // thread forks meanwhile holds a copy of go_to_child until it execs, and could
                // keep this child waiting for the end of file as long. A failed write means the
                // child is gone; spawn reports that.
                let answer = if registered.is_ok() { GO } else { NO_GO };
                let _ = go_to_child.write_all(&[answer]);
                Some(registered)
            })
            .map_err(SpawnHeldError::Thread)?;
        // On a refusal the child exits at the gate and spawn reaps it before it returns.
        let spawned = command.spawn();
        drop((pid_to_parent, go_from_parent));
        let registered = registrar
            .join()
            .expect("the registrar thread does not panic");
        match (spawned, registered) {
            (Ok(child), Some(Ok(()))) => Ok(child),
            (spawned, Some(Err(e))) => {
                if let Ok(mut child) = spawned {
                    // Cannot happen (a refused child does not exec); if it did, nothing may
                    // run unregistered.
                    let _ = child.kill();
                    let _ = child.wait();
                }
                Err(SpawnHeldError::Register(e))
            }
            (Ok(_), None) => unreachable!("a child that execs passed the gate"),
            (Err(e), _) => Err(SpawnHeldError::Spawn(e)),
        }
    });
    armed.store(false, Ordering::Relaxed);
    result
}

/// Why [`spawn_held`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnHeldError<E> {
    #[error("could not start the command: {0}")]
    Spawn(#[from] io::Error),
    /// The thread that registers the child could not be started (nothing was forked).
    #[error(
        "could not start a thread to register the command: {0} (is the user at its process \
         limit, RLIMIT_NPROC or ulimit -u?)"
    )]
    Thread(io::Error),
    #[error("could not register the command's process")]
    Register(#[source] E),
}

/// Makes `fd` inherited by the child `command` spawns, and returns its number there (the same
/// as here, 3 or above). `command` holds `fd` open for as long as it lives. Every descriptor std
/// opens is close-on-exec; this clears the flag in the child only, after fork, so no other child
/// (another thread may be forking at the same moment) inherits it. The same number, not a fixed one: a dup2 onto a fixed number could
/// replace a descriptor the child still needs, such as the pipe std's spawn reports a failed
/// exec on, which may well be fd 3.
pub fn pass_fd(command: &mut Command, fd: OwnedFd) -> io::Result<RawFd> {
    // A standard stream's number would be replaced by the child's stdin, stdout or stderr.
    let fd = if fd.as_raw_fd() <= 2 {
        duplicate_fd(fd.as_raw_fd())?
    } else {
        fd
    };
    let raw = fd.as_raw_fd();
    let pass = move || -> io::Result<()> {
        // Owned by the closure, so open in the parent while the command can be spawned.
        let _ = &fd;
        // SAFETY: fcntl is async-signal-safe and allocates nothing; `raw` is open in the child
        // (it was open in the parent at fork, held by this closure).
        if unsafe { libc::fcntl(raw, libc::F_SETFD, 0) } == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the closure makes only one async-signal-safe call and allocates nothing.
    unsafe { command.pre_exec(pass) };
    Ok(raw)
}

/// Takes ownership of `fd`, a descriptor this process inherited at exec (as `leash exec
/// --lease-fd N` is given one), so that it is closed when dropped. Refuses 0, 1 and 2 (the
/// standard streams, which the command run next needs) and a descriptor that is not open. Call
/// it once, early, before this process opens anything: a number that was not inherited could
/// otherwise name a descriptor something else owns.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if fd <= 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is a standard stream; use 3 or above"),
        ));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if fd is not open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(
            error.kind(),
            format!("fd {fd} is not open: {error}"),
        ));
    }
    // SAFETY: fd is open (checked above) and, per this function's contract, an inherited
    // descriptor nothing else in this process owns or will close.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A close-on-exec copy of descriptor `fd`, numbered 3 or above.
pub fn duplicate_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only creates a new descriptor; it fails with EBADF if fd is not
    // open.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` is a new, open descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Marks `fd` close-on-exec, so that a program this process execs does not inherit it.
pub fn set_cloexec(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_SETFD only sets the flags of a descriptor `fd` keeps open.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for process `pid` of this process's pid namespace (pidfd_open, Linux 5.3): it names
/// that process for good, whatever namespace the daemon that receives it runs in.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Writes all of `bytes` to the connected Unix socket `socket`, with `fd` attached to the first
/// byte (SCM_RIGHTS): the daemon takes a descriptor sent with a request line as that request's.
pub fn send_with_fd(socket: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    const FD_SPACE: usize = size_of::<RawFd>();
    // CMSG_SPACE for one descriptor, in a buffer aligned for cmsghdr.
    #[repr(C)]
    union Control {
        header: libc::cmsghdr,
        bytes: [u8; 64],
    }
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(FD_SPACE as u32) } as usize;
    assert!(space <= 64, "one descriptor's control message fits");
    let mut control = Control { bytes: [0; 64] };
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty one.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = (&raw mut control).cast();
    message.msg_controllen = space as _;
    // SAFETY: the control buffer holds one cmsghdr with room for one descriptor (space, checked
    // above); CMSG_FIRSTHDR and CMSG_DATA point inside it.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&raw const message);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(FD_SPACE as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd.as_raw_fd());
    }
    let sent = loop {
        // SAFETY: message points at iov and control, both alive for the call; the socket is
        // open.
        let sent =
            unsafe { libc::sendmsg(socket.as_raw_fd(), &raw const message, libc::MSG_NOSIGNAL) };
        if sent >= 0 {
            break sent as usize;
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    };
    // The descriptor went with the first part; the rest is plain bytes.
    (&*socket).write_all(&bytes[sent..])
}

#[cfg(test)]
mod tests {
    use std::{path::Path, sync::mpsc, time::Duration};

    use super::*;

    /// Before, this hung for ever: the held child waited on a pipe it held open itself.
    #[test]
    fn a_refused_child_runs_nothing_and_is_reaped() {
        let marker = std::env::temp_dir().join(format!("leash-refused-{}", std::process::id()));
        let (held, held_pid) = mpsc::channel();
        let (done, returned) = mpsc::channel();
        let touch = marker.clone();
        thread::spawn(move || {
            let result = spawn_held(Command::new("touch").arg(&touch), |pid| {
                let _ = held.send(pid);
                Err("refused")
            });
            let _ = done.send(result.map(|_| ()).map_err(|e| e.to_string()));
        });
        let pid = held_pid
            .recv_timeout(Duration::from_secs(30))
            .expect("the child reached the gate");
        let Ok(result) = returned.recv_timeout(Duration::from_secs(30)) else {
            // Not left holding this test's output open for ever.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("spawn_held did not return after the refusal: the held child hangs");
        };
        assert_eq!(
            result.unwrap_err(),
            "could not register the command's process"
        );
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "the held child was reaped"
        );
        assert!(!marker.exists(), "the refused command never ran");
    }

    #[test]
    fn a_passed_fd_reaches_its_child_under_its_number() {
        let (reader, mut writer) = io::pipe().unwrap();
        writer.write_all(b"secret\n").unwrap();
        drop(writer);
        let mut command = Command::new("sh");
        let fd = pass_fd(&mut command, reader.into()).unwrap();
        assert!(fd > 2);
        let output = command
            .arg("-c")
            .arg(format!("cat <&{fd}"))
            .output()
            .unwrap();
        assert_eq!(output.stdout, b"secret\n");
    }

    #[test]
    fn standard_streams_and_closed_fds_are_not_taken() {
        assert!(take_inherited_fd(1).is_err());
        assert!(
            take_inherited_fd(1_000_000)
                .unwrap_err()
                .to_string()
                .contains("not open")
        );
    }
}
