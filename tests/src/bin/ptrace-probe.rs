//! `ptrace-probe`: tries one ptrace-class access to another process and prints what the kernel
//! answered, for the ptrace guard's tests (the vmtest guests have no strace or gdb).
//!
//! - `attach PID`: PTRACE_SEIZE (an attach that stops nothing; exiting detaches).
//! - `getfd PID FD`: `pidfd_getfd` of the process's descriptor FD.
//! - `vmwrite PID [ADDR]`: `process_vm_writev` of `WRITTEN` to address ADDR (hex) of the
//!   process, 1 if not given. The access check comes first: EPERM is a refusal; at address 1,
//!   EFAULT means the check passed, and nothing was written.
//! - `hold`: a target for `vmwrite`: prints `PID ADDR` (its pid and the address of an 8-byte
//!   buffer holding `UNTOUCH\0`), then sleeps; whoever started it reads the buffer.
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
        (Some("vmwrite"), Some(pid), _) => vmwrite(pid, args.get(2).map(String::as_str)),
        (Some("hold"), _, _) => return hold(),
        (Some("memopen"), Some(pid), _) => memopen(pid),
        _ => {
            eprintln!(
                "usage: ptrace-probe attach PID | getfd PID FD | vmwrite PID [ADDR] | memopen PID \
                 | hold"
            );
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

/// What `hold` holds, and `vmwrite` writes.
static HELD: std::sync::Mutex<[u8; 8]> = std::sync::Mutex::new(*b"UNTOUCH\0");
const WRITTEN: [u8; 8] = *b"WRITTEN\0";

fn hold() -> ExitCode {
    let address = HELD.lock().map_or(0, |held| held.as_ptr() as usize);
    println!("{} {address:x}", std::process::id());
    // Whoever runs it reads the buffer through /proc/PID/mem, and kills it.
    std::thread::sleep(std::time::Duration::from_secs(600));
    ExitCode::SUCCESS
}

fn vmwrite(pid: i32, address: Option<&str>) -> io::Result<()> {
    let mut data = WRITTEN;
    let local = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // Address 1 (c_void's dangling pointer) is never mapped: an access that passes the check
    // fails with EFAULT.
    let address = match address.map(|a| usize::from_str_radix(a, 16)) {
        Some(Ok(address)) => address as *mut libc::c_void,
        Some(Err(_)) => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        None => std::ptr::dangling_mut::<libc::c_void>(),
    };
    let remote = libc::iovec {
        iov_base: address,
        iov_len: data.len(),
    };
    // SAFETY: the local vector points at 8 bytes of ours; the remote one is the other
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
