//! What /proc says about processes: used to seed a tree with a root's existing descendants and
//! to check that a pid still names the process it named (pid + start time).

mod files;
mod usage;
mod walk;

use std::collections::HashMap;

use leash_common::{Member, Pid};

pub use self::usage::{Usage, usage};
pub use self::walk::{Descendants, Visit, WalkCounts, descendants_in_batches, descendants_of};
use crate::sys::Pidfd;

/// One process as /proc shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: Pid,
    pub ppid: Pid,
    /// Start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start_ticks: u64,
    /// The state letter: R, S, D, Z (zombie), X (dead), ...
    pub state: char,
    pub comm: String,
}

impl ProcessInfo {
    /// Still running code: not a zombie and not dead.
    pub fn is_live(&self) -> bool {
        !matches!(self.state, 'Z' | 'X')
    }

    pub fn reference(&self) -> ProcessRef {
        ProcessRef {
            pid: self.pid,
            start_ticks: self.start_ticks,
        }
    }

    fn from_stat(stat: procfs::process::Stat) -> Self {
        Self {
            pid: stat.pid as Pid,
            ppid: stat.ppid as Pid,
            start_ticks: stat.starttime,
            state: stat.state,
            comm: stat.comm,
        }
    }
}

/// Reads /proc/PID/stat; None when there is no such process (or it vanished while reading),
/// and when it cannot be read: for a caller to whom both mean "nothing to show". Where a
/// failure must not pass for a process gone, use [`read_process`].
pub fn process(pid: Pid) -> Option<ProcessInfo> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    Some(ProcessInfo::from_stat(stat))
}

/// Reads /proc/PID/stat: Ok(None) only when there is no such process (ENOENT, or ESRCH for one
/// that vanished while it was read); any other failure (out of descriptors, say) is an error,
/// which says nothing about the process. A shortage is waited out a little first.
pub fn read_process(pid: Pid) -> std::io::Result<Option<ProcessInfo>> {
    let read = || procfs::process::Process::new(pid as i32).and_then(|p| p.stat());
    match crate::sys::retry_on_shortage(|| read().map_err(into_io)) {
        Ok(stat) => Ok(Some(ProcessInfo::from_stat(stat))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// A procfs error as the I/O error it came from; "no such process" (which procfs makes of
/// ENOENT and ESRCH) as NotFound.
fn into_io(error: procfs::ProcError) -> std::io::Error {
    use std::io::{Error, ErrorKind};
    match error {
        procfs::ProcError::NotFound(_) => Error::from(ErrorKind::NotFound),
        procfs::ProcError::Io(e, _) => e,
        other => Error::other(other.to_string()),
    }
}

/// One process, for good: its pid and its start time (clock ticks since boot, as /proc gives
/// it). A pid alone may name a newer process once the first is reaped; the pair never does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessRef {
    pub pid: Pid,
    pub start_ticks: u64,
}

impl ProcessRef {
    /// The process a member entry names: the entry of `pid`, `member`.
    pub fn of_member(pid: Pid, member: &Member) -> Self {
        Self {
            pid,
            start_ticks: ns_to_ticks(member.start_ns),
        }
    }

    /// Whether `member`, the member map's entry of this process's pid, is this very process's:
    /// it was made for a process that started when this one did, not for an earlier one the
    /// pid named (an entry outlives its process until an exit program or a kill takes it out).
    pub fn is(self, member: &Member) -> bool {
        ns_to_ticks(member.start_ns) == self.start_ticks
    }

    /// The process `pid` names now, if any.
    pub fn of(pid: Pid) -> Option<Self> {
        process(pid).map(|p| p.reference())
    }

    /// Whether this very process still runs: its pid names a process that started when it did.
    pub fn is_running(self) -> bool {
        read_process(self.pid)
            .is_ok_and(|now| now.is_some_and(|now| now.start_ticks == self.start_ticks))
    }

    /// Whether this process is gone or on its way out: the kernel marks a process exiting
    /// (PF_EXITING) before it closes its files, so a dying host's sockets close while this
    /// already says so. False if /proc cannot say.
    pub fn is_exiting(self) -> bool {
        const PF_EXITING: u32 = 0x4;
        match procfs::process::Process::new(self.pid as i32).and_then(|p| p.stat()) {
            Ok(stat) => {
                stat.starttime != self.start_ticks
                    || matches!(stat.state, 'Z' | 'X')
                    || stat.flags & PF_EXITING != 0
            }
            Err(procfs::ProcError::NotFound(_)) => true,
            Err(_) => false,
        }
    }

    /// A pidfd for this very process, or None if it is gone (reaped, its pid perhaps another
    /// process's by now). The pidfd is opened first and the start time read after: a match
    /// means the pid still named this process after the pidfd was opened, so the pidfd is its.
    /// An error (EMFILE, say), from either step, says nothing about the process: it is
    /// returned, never taken for the process gone.
    pub fn open(self) -> std::io::Result<Option<Pidfd>> {
        let pidfd = match Pidfd::open(self.pid) {
            Ok(pidfd) => pidfd,
            // No such process; or the pid names a thread now, of some other process.
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let same = read_process(self.pid)?.is_some_and(|now| now.start_ticks == self.start_ticks);
        Ok(same.then_some(pidfd))
    }

    /// Whether this process has finished exiting: every thread of it has, so its memory,
    /// files, sockets and locks are released (it is a zombie, or reaped). Its pidfd says so;
    /// the main thread's state in /proc does not (it reads `Z` while other threads still run
    /// or tear down). False when that cannot be found out now.
    pub fn has_exited(self) -> bool {
        self.exited().unwrap_or(false)
    }

    /// [`ProcessRef::has_exited`], or the error (EMFILE, say) that kept it from being found out.
    pub fn exited(self) -> std::io::Result<bool> {
        match Pidfd::open(self.pid) {
            Err(e) if is_gone(&e) => Ok(true),
            Err(e) => Err(e),
            // Readable: whatever process the pidfd names has exited, and if it is a newer one
            // by this pid, this one was reaped before it. Not readable: this process is still
            // exiting if the pid still names it, and long gone if it names another.
            Ok(pidfd) => Ok(pidfd.has_exited()
                || read_process(self.pid)?.is_none_or(|now| now.start_ticks != self.start_ticks)),
        }
    }
}

/// Whether pidfd_open's error means no process has that pid: none at all (ESRCH), or the pid
/// names a thread, of some other process (EINVAL, or ENOENT on newer kernels).
pub fn is_gone(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ESRCH | libc::EINVAL | libc::ENOENT)
    )
}

/// The numbers process `pid` has in each pid namespace it is in, from the daemon's (the one
/// /proc was mounted for) down to its own: one number for a process of the daemon's namespace,
/// two for one in a container's, and so on. `NSpid` in /proc/PID/status, which anyone may read
/// (the namespace links in /proc/PID/ns need ptrace rights over the process).
pub fn namespace_pids(pid: Pid) -> Option<Vec<Pid>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let numbers = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))?;
    numbers.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// Whether process `pid` runs in the initial user namespace: its /proc/PID/uid_map, which
/// anyone may read, maps every uid to itself (only the initial namespace's does, or one root
/// made as its copy, where a uid is the same user). None if it cannot be read (it has exited).
pub fn in_initial_user_namespace(pid: Pid) -> Option<bool> {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).ok()?;
    let ranges: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    Some(ranges == [["0", "0", "4294967295"]])
}

/// The inode number of this process's pid namespace (from /proc/self/ns/pid, which a process
/// may read of itself): what names the daemon's namespace among its clients'.
pub fn own_pid_namespace() -> std::io::Result<u32> {
    let link = std::fs::read_link("/proc/self/ns/pid")?;
    let link = link.to_string_lossy();
    link.strip_prefix("pid:[")
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|inum| inum.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/self/ns/pid: {link}")))
}

/// The pid of the process pidfd `fd` names, from /proc/self/fdinfo: None if `fd` is not a pidfd
/// (only a pidfd's fdinfo has a `Pid:` line); 0 or below if the process has been reaped, or is
/// in no pid namespace the daemon sees.
pub fn pidfd_pid(fd: std::os::fd::BorrowedFd<'_>) -> Option<i64> {
    use std::os::fd::AsRawFd;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()
}

/// The thread group (process) that thread `tid` belongs to, from /proc/TID/status.
pub fn thread_group_of(tid: Pid) -> Option<Pid> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// PF_EXITING in a task's flags: the thread has begun exiting.
const PF_EXITING: u32 = 0x4;

/// The start time of process `pid` if its thread group is alive (see [`group_alive`]): one
/// read of /proc/PID/stat when its main thread runs, the threads' only when it does not.
pub fn alive_start(pid: Pid) -> Option<u64> {
    let stat = files::stat(pid, &mut Vec::new())?;
    let leader_runs = stat.flags & PF_EXITING == 0 && !matches!(stat.state, 'Z' | 'X');
    // A zombie main thread keeps its pid: the threads read next are this process's.
    (leader_runs || group_alive(pid)).then_some(stat.starttime)
}

/// Whether some thread of process `pid` has not begun exiting, which means the thread group is
/// not dead yet: its death, when it comes, is still ahead. A process whose main thread has
/// exited while others run is alive. False for no such process.
pub fn group_alive(pid: Pid) -> bool {
    let Ok(tasks) = procfs::process::Process::new(pid as i32).and_then(|p| p.tasks()) else {
        return false;
    };
    tasks.filter_map(Result::ok).any(|task| {
        task.stat()
            .is_ok_and(|stat| stat.flags & PF_EXITING == 0 && !matches!(stat.state, 'Z' | 'X'))
    })
}

/// How many tasks (threads) the machine has now, from /proc/loadavg's fourth field
/// (`running/all`): what a pass of a task iterator walks.
pub fn tasks_on_the_machine() -> Option<u64> {
    let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
    let running_and_all = loadavg.split_whitespace().nth(3)?;
    running_and_all.split_once('/')?.1.parse().ok()
}

/// Whether `pid` is known to have no children right now: every thread's
/// /proc/PID/task/TID/children file is empty, and the threads did not change while they were
/// read (a thread that exits hands its children to another, perhaps one already read). False
/// when that cannot be shown, including on kernels without those files.
pub fn is_childless(pid: Pid) -> bool {
    let threads = || -> Option<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        Some(names)
    };
    let Some(before) = threads() else {
        return false;
    };
    // Only whether each file is empty: a fan's whole file would take one read per page, each
    // of which the kernel starts by walking the children listed before it.
    let childless = before
        .iter()
        .all(|tid| files::is_empty(&format!("/proc/{pid}/task/{tid}/children")).unwrap_or(false));
    childless && threads() == Some(before)
}

/// Every process on the machine. Processes that vanish during the walk are left out.
pub fn all_processes() -> std::io::Result<Vec<ProcessInfo>> {
    let all = procfs::process::all_processes().map_err(std::io::Error::other)?;
    Ok(all
        .filter_map(Result::ok)
        .filter_map(|p| p.stat().ok())
        .map(ProcessInfo::from_stat)
        .collect())
}

/// The descendants of `root` in a snapshot, in breadth-first order (root excluded). `stop` cuts
/// the walk below a process (its own descendants are not visited).
pub fn descendants(
    snapshot: &[ProcessInfo],
    root: Pid,
    mut stop: impl FnMut(&ProcessInfo) -> bool,
) -> Vec<&ProcessInfo> {
    let mut children: HashMap<Pid, Vec<&ProcessInfo>> = HashMap::new();
    for p in snapshot {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for child in children.get(&pid).into_iter().flatten() {
            // pid 0's "children" are init and kthreadd: never walk up from there.
            if child.pid == pid || stop(child) {
                continue;
            }
            found.push(*child);
            queue.push(child.pid);
        }
    }
    found
}

/// Nanoseconds since boot (CLOCK_BOOTTIME, the clock of start times), from /proc/uptime.
pub fn boot_time_ns() -> Option<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some((seconds * 1e9) as u64)
}

/// Clock ticks per second for /proc's times (USER_HZ).
pub fn ticks_per_second() -> u64 {
    procfs::ticks_per_second()
}

pub fn ticks_to_ns(ticks: u64) -> u64 {
    ticks * (1_000_000_000 / ticks_per_second())
}

/// The /proc start time of a process that started `ns` after boot (the kernel divides the same
/// way, so the result is exact).
pub fn ns_to_ticks(ns: u64) -> u64 {
    ns / (1_000_000_000 / ticks_per_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_in_the_initial_user_namespace() {
        assert_eq!(in_initial_user_namespace(std::process::id()), Some(true));
        assert!(own_pid_namespace().unwrap() > 0);
    }

    fn p(pid: Pid, ppid: Pid) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid,
            start_ticks: 0,
            state: 'S',
            comm: format!("p{pid}"),
        }
    }

    #[test]
    fn descendants_walks_every_generation() {
        let snapshot = vec![p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(13, 10), p(20, 1)];
        let mut found: Vec<Pid> = descendants(&snapshot, 10, |_| false)
            .iter()
            .map(|p| p.pid)
            .collect();
        found.sort();
        assert_eq!(found, vec![11, 12, 13]);
    }

    #[test]
    fn descendants_stops_where_told() {
        let snapshot = vec![p(10, 1), p(11, 10), p(12, 11), p(13, 10)];
        let mut found: Vec<Pid> = descendants(&snapshot, 10, |p| p.pid == 11)
            .iter()
            .map(|p| p.pid)
            .collect();
        found.sort();
        assert_eq!(found, vec![13]);
    }

    #[test]
    fn this_process_is_live_and_ticks_round_trip() {
        let me = process(std::process::id()).unwrap();
        assert!(me.is_live());
        assert_eq!(ns_to_ticks(ticks_to_ns(me.start_ticks)), me.start_ticks);
        assert!(!me.reference().has_exited());
        assert!(group_alive(me.pid));
        let older = ProcessRef {
            start_ticks: me.start_ticks + 1,
            ..me.reference()
        };
        assert!(older.has_exited(), "another process by that pid");
        assert!(all_processes().unwrap().iter().any(|p| p.pid == me.pid));
    }

    #[test]
    fn a_process_with_a_child_is_not_childless() {
        use std::io::BufRead;
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 600 & echo $!; read line; kill $!"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut sleep = String::new();
        std::io::BufReader::new(sh.stdout.take().unwrap())
            .read_line(&mut sleep)
            .unwrap();
        let sleep: Pid = sleep.trim().parse().unwrap();
        assert!(!is_childless(sh.id()));
        assert!(is_childless(sleep));
        assert!(!is_childless(u32::MAX), "no such process");
        drop(sh.stdin.take());
        sh.wait().unwrap();
    }

    #[test]
    fn a_zombie_has_exited() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let true_ = ProcessRef::of(pid).unwrap();
        // Unreaped, it stays a zombie: exited, though its pid is still taken.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !true_.has_exited() {
            assert!(std::time::Instant::now() < deadline, "true did not exit");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(process(pid).is_some_and(|p| p.state == 'Z'));
        assert!(!group_alive(pid));
        child.wait().unwrap();
        assert!(true_.has_exited());
    }
}
