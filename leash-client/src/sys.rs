//! The one module of leash-client that uses `unsafe`: starting a process held between fork and
//! exec, with only async-signal-safe calls in the child.

use std::{
    io::{self, Read, Write},
    os::{fd::AsRawFd, unix::process::CommandExt},
    process::{Child, Command},
    thread,
};

/// Spawns `command` held between fork and exec: the child reports its pid, `register` runs
/// (on another thread, while this one waits in `spawn`), and only if it succeeds does the child
/// go on to exec. So the process is registered before it runs one instruction of the command.
/// If `register` fails the child exits without running the command and its error is returned.
pub fn spawn_held<E: Send>(
    command: &mut Command,
    register: impl FnOnce(u32) -> Result<(), E> + Send,
) -> Result<Child, SpawnHeldError<E>> {
    let (mut pid_from_child, pid_to_parent) = io::pipe()?;
    let (go_from_parent, mut go_to_child) = io::pipe()?;
    let (write_fd, read_fd) = (pid_to_parent.as_raw_fd(), go_from_parent.as_raw_fd());
    let hold = move || -> io::Result<()> {
        // Only async-signal-safe calls between fork and exec: getpid, write, read.
        // SAFETY: both fds stay open in the child (the parent keeps them until spawn returns)
        // and the buffers are valid for their lengths.
        unsafe {
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(write_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(io::Error::last_os_error());
            }
            let mut go = 0u8;
            if libc::read(read_fd, (&raw mut go).cast(), 1) != 1 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the process was not registered, so it was not started",
                ));
            }
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe calls (see above).
    unsafe { command.pre_exec(hold) };

    thread::scope(|scope| {
        let registrar = scope.spawn(move || {
            let mut pid = [0u8; 4];
            // End of file: the child never reached the gate (spawn failed before it).
            pid_from_child.read_exact(&mut pid).ok()?;
            let registered = register(u32::from_ne_bytes(pid));
            if registered.is_ok() {
                // A failed write means the child is gone; spawn reports that.
                let _ = go_to_child.write_all(&[1]);
            }
            // Dropping go_to_child without a byte makes the held child give up.
            Some(registered)
        });
        let spawned = command.spawn();
        drop((pid_to_parent, go_from_parent));
        let registered = registrar
            .join()
            .expect("the registrar thread does not panic");
        match (spawned, registered) {
            (_, Some(Err(e))) => Err(SpawnHeldError::Register(e)),
            (Ok(child), Some(Ok(()))) => Ok(child),
            (Ok(_), None) => unreachable!("a child that execs passed the gate"),
            (Err(e), _) => Err(SpawnHeldError::Spawn(e)),
        }
    })
}

/// Why [`spawn_held`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnHeldError<E> {
    #[error("could not start the command: {0}")]
    Spawn(#[from] io::Error),
    #[error("could not register the command's process")]
    Register(#[source] E),
}
