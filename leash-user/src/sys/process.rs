//! The process itself: its umask, environment, limits, scheduling and memory, the clocks, the
//! random number generator, and the group database.

use std::{
    ffi::{CStr, CString, OsStr, OsString},
    io,
    os::unix::ffi::OsStrExt,
};

/// This process's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes nothing, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Sets the process's file mode creation mask to `mask`; returns the one it replaces. The mask
/// is the whole process's: change it only while no other thread makes files.
pub fn umask(mask: u32) -> u32 {
    // SAFETY: umask takes a number, touches no memory of ours and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// The id of the group named `name` in the system's group database (getgrnam_r: /etc/group,
/// or whatever NSS is set up to ask). None if there is no such group.
pub fn group_id(name: &str) -> io::Result<Option<u32>> {
    let name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut buffer = vec![0u8; 1024];
    loop {
        // SAFETY: zeroed group and null pointer are valid out-parameters; name is
        // NUL-terminated; buffer is valid for its length and outlives the call, and the
        // strings the result points into are not read.
        let (rc, found) = unsafe {
            let mut group: libc::group = std::mem::zeroed();
            let mut result: *mut libc::group = std::ptr::null_mut();
            let rc = libc::getgrnam_r(
                name.as_ptr(),
                &raw mut group,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &raw mut result,
            );
            (rc, (!result.is_null()).then_some(group.gr_gid))
        };
        match rc {
            0 => return Ok(found),
            // A group with many members needs more room; 1 MiB is more than any sane one.
            libc::ERANGE if buffer.len() < 1 << 20 => buffer.resize(buffer.len() * 4, 0),
            errno => return Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

unsafe extern "C" {
    /// The C library's environment: "NAME=VALUE" strings, up to a null pointer.
    static mut environ: *mut *mut libc::c_char;
}

/// Removes variable `name` from this process's environment and returns its value, once wiped
/// where /proc/PID/environ shows it. The kernel shows the block the process was started with,
/// which unsetenv leaves as it was: a secret there is readable by every process of the same
/// user for as long as this one runs. Call it before any other thread starts.
pub fn take_env_secret(name: &str) -> Option<OsString> {
    let prefix = format!("{name}=");
    let mut value = None;
    // SAFETY: no other thread runs (the caller's promise), so nothing changes the environment
    // meanwhile. Every entry of `environ` up to the null one is a NUL-terminated string of this
    // process's own, writable memory (the block the kernel set up on the stack, or one setenv
    // allocated); the bytes overwritten are the value's, before its NUL.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let bytes = CStr::from_ptr(*entry).to_bytes();
            if let Some(found) = bytes.strip_prefix(prefix.as_bytes()) {
                let length = found.len();
                value.get_or_insert_with(|| OsStr::from_bytes(found).to_owned());
                std::ptr::write_bytes((*entry).add(prefix.len()), 0, length);
            }
            entry = entry.add(1);
        }
        std::env::remove_var(name);
    }
    value
}

/// Fills `bytes` from the kernel's random number generator (getrandom(2)): no descriptor is
/// needed, so it works when a process is out of them, where reading /dev/urandom does not.
pub fn random_bytes(bytes: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: `rest` is valid for writes of its length.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if got < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        filled += got as usize;
    }
    Ok(())
}

/// The limits on open file descriptors (RLIMIT_NOFILE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit before it was raised.
    pub was: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit on open file descriptors to the hard limit, which needs no
/// privilege. The soft limit is often 1024 while the hard one is far higher: kept low for
/// programs that still use select(2), which this one does not.
pub fn raise_fd_limit() -> io::Result<FdLimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let was = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit, read above, with the soft limit raised to the
        // hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(FdLimit {
        was,
        soft: limit.rlim_cur,
        hard: limit.rlim_max,
    })
}

/// CLOCK_BOOTTIME in nanoseconds: the clock of the kernel's task start times and of the
/// programs' `bpf_ktime_get_boot_ns`.
pub fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

/// CLOCK_MONOTONIC in nanoseconds: to compare a moment here with one another process took
/// (std's `Instant` is that clock, but opaque).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into; both clocks used here always exist.
    unsafe { libc::clock_gettime(clock, &raw mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Sets the calling thread's nice value (lower runs first; below 0 needs CAP_SYS_NICE).
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid takes nothing and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority takes numbers only; on Linux PRIO_PROCESS with a thread id sets
    // that one thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// While one is held, the calling thread runs in the real-time class (SCHED_FIFO, the lowest
/// real-time priority), where no process of the normal classes preempts it; when the last one
/// a thread holds is dropped, the thread goes back to the normal class, its nice value as it
/// was (the kernel keeps it across the switch). Nothing changes where the kernel refuses (no
/// CAP_SYS_NICE, or a cgroup given no real-time runtime). Hold them only for bursts of work:
/// the kernel's throttling leaves the other classes 5% of a CPU, and that is all it promises.
#[must_use = "the thread is real-time only while this is held"]
#[derive(Debug)]
pub struct Unpreempted {
    // Not Send: it belongs to the thread it was taken on.
    _thread: std::marker::PhantomData<*const ()>,
}

thread_local! {
    /// How many `Unpreempted` this thread holds, and whether the first one made it real-time.
    static UNPREEMPTED: std::cell::Cell<(u32, bool)> = const { std::cell::Cell::new((0, false)) };
}

impl Unpreempted {
    pub fn begin() -> Self {
        UNPREEMPTED.with(|held| {
            let (count, raised) = held.get();
            let raised = if count == 0 {
                set_realtime(true)
            } else {
                raised
            };
            held.set((count + 1, raised));
        });
        Self {
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for Unpreempted {
    fn drop(&mut self) {
        UNPREEMPTED.with(|held| {
            let (count, raised) = held.get();
            if count == 1 && raised {
                set_realtime(false);
            }
            held.set((count.saturating_sub(1), raised && count > 1));
        });
    }
}

/// Puts the calling thread in the real-time class, or back in the normal one; returns whether
/// the kernel did.
fn set_realtime(on: bool) -> bool {
    let (policy, priority) = if on {
        // A child forked meanwhile starts in the normal class.
        (libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, 1)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler reads the sched_param it is given, valid for the call; pid 0
    // is the calling thread.
    unsafe { libc::sched_setscheduler(0, policy, &raw const param) == 0 }
}

/// Gives the memory the allocator holds free back to the system (glibc keeps what a burst of
/// work freed, so the daemon's size would otherwise stay at its peak).
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_fill_the_buffer() {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        random_bytes(&mut a).unwrap();
        random_bytes(&mut b).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; 32]);
    }

    #[test]
    fn the_soft_fd_limit_is_raised_to_the_hard_one() {
        let limit = raise_fd_limit().unwrap();
        assert_eq!(limit.soft, limit.hard);
        assert!(limit.was <= limit.soft);
        assert_eq!(raise_fd_limit().unwrap().was, limit.soft, "it stays raised");
    }

    fn policy() -> i32 {
        // SAFETY: sched_getscheduler takes a number (0: the calling thread) and reads nothing.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_thread_is_real_time_until_the_last_of_its_unpreempted_is_dropped() {
        let (nice_before, before) = (nice(), policy());
        let outer = Unpreempted::begin();
        if policy() == before {
            eprintln!("real-time scheduling refused here (not root?): nothing to check");
            return;
        }
        assert_eq!(policy() & !libc::SCHED_RESET_ON_FORK, libc::SCHED_FIFO);
        let inner = Unpreempted::begin();
        drop(inner);
        assert_eq!(
            policy() & !libc::SCHED_RESET_ON_FORK,
            libc::SCHED_FIFO,
            "one still held"
        );
        drop(outer);
        assert_eq!(policy(), before);
        assert_eq!(nice(), nice_before, "the nice value is kept");
    }

    fn nice() -> i32 {
        // SAFETY: getpriority takes numbers only (PRIO_PROCESS with 0: the calling thread).
        unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
    }
}
