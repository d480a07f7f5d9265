//! What /proc says about processes: used to seed a tree with a root's existing descendants and
//! to check that a pid still names the process it named (pid + start time).

use std::collections::HashMap;

use leash_common::Pid;

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

/// Reads /proc/PID/stat; None when there is no such process (or it vanished while reading).
pub fn process(pid: Pid) -> Option<ProcessInfo> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    Some(ProcessInfo {
        pid: stat.pid as Pid,
        ppid: stat.ppid as Pid,
        start_ticks: stat.starttime,
        state: stat.state,
        comm: stat.comm,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            ticks_to_ns(me.start_ticks) / (1_000_000_000 / ticks_per_second()),
            me.start_ticks
        );
        assert!(all_processes().unwrap().iter().any(|p| p.pid == me.pid));
    }
}
