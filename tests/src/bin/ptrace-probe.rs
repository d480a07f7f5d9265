//! `ptrace-probe`: tries one ptrace-class access to another process and prints what the kernel
//! answered, for the ptrace guard's tests (the vmtest guests have no strace or gdb).
//!
//! - `attach PID`: PTRACE_SEIZE (an attach that stops nothing; exiting detaches).
//! - `getfd PID FD`: `pidfd_getfd` of the process's descriptor FD.
//! - `vmwrite PID`: `process_vm_writev` of one byte to address 1 of the process. The access
//!   check comes first: EPERM is a refusal; EFAULT (the address) means the check passed, and
//!   nothing was written.
//! - `memopen PID`: opens /proc/PID/mem for writing.
//!
//! Prints `ok` or `errno N` and exits 0; exits 2 on bad arguments. A process the fallback guard
//! refuses is SIGKILLed before it prints.

use std::{io, process::ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |index: usize| args.get(index).and_then(|a| a.parse::<i32>().ok());
    let outcome = match (args.first().map(String::as_str), number(1), number(2)) {
        (Some("attach"), Some(pid), _) => attach(pid),
        (Some("getfd"), Some(pid), Some(fd)) => getfd(pid, fd),
        (Some("vmwrite"), Some(pid), _) => vmwrite(pid),
        (Some("memopen"), Some(pid), _) => memopen(pid),
        _ => {
            eprintln!("usage: ptrace-probe attach PID | getfd PID FD | vmwrite PID | memopen PID");
            return ExitCode::from(2);
        }
    };
    match outcome {
        Ok(()) => println!("ok"),
        Err(e) => println!("errno {}", e.raw_os_error().unwrap_or(0)),
    }
    ExitCode::SUCCESS
}

fn check(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn attach(pid: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SEIZE takes a pid and no memory of ours (addr and data 0).
    check(unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) })?;
    Ok(())
}

fn getfd(pid: i32, fd: i32) -> io::Result<()> {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor.
    let pidfd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: pidfd_getfd takes descriptors and flags.
    let got = check(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) });
    // SAFETY: both are descriptors this process owns.
    unsafe {
        libc::close(pidfd as i32);
        if let Ok(got) = got {
            libc::close(got as i32);
        }
    }
    got.map(|_| ())
}

fn vmwrite(pid: i32) -> io::Result<()> {
    let mut byte = 0u8;
    let local = libc::iovec {
        iov_base: (&raw mut byte).cast(),
        iov_len: 1,
    };
    // Address 1 (c_void's dangling pointer) is never mapped: an access that passes the check
    // fails with EFAULT.
    let remote = libc::iovec {
        iov_base: std::ptr::dangling_mut::<libc::c_void>(),
        iov_len: 1,
    };
    // SAFETY: the local vector points at one byte of ours; the remote one is the other
    // process's, which the kernel checks.
    check(unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) } as libc::c_long)?;
    Ok(())
}

fn memopen(pid: i32) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map(drop)
}
