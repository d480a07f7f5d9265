//! What a process runs and uses, for `list`: its user, command line, CPU time and resident
//! memory. The daemon reads these for its clients, which may not be able to (a client in a
//! container, or under `hidepid`, cannot read the members' /proc).

use std::io::Read;

use leash_common::Pid;
use procfs::process::Process;

/// One process's figures, read at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Start time in clock ticks since boot: with the pid, names the process.
    pub start_ticks: u64,
    pub comm: String,
    /// The state letter: R, S, D, Z (zombie), ...
    pub state: char,
    /// The effective uid (None if /proc/PID/status could not be read).
    pub uid: Option<u32>,
    /// argv joined by spaces, at most `cmdline_bytes` of it; None when it has none.
    pub cmdline: Option<String>,
    /// User and system time of all its threads, those that ended included.
    pub cpu_ms: u64,
    pub rss_bytes: u64,
}

/// Reads `pid`'s figures: /proc/PID/stat, the `Uid:` line of its status and at most
/// `cmdline_bytes` of its cmdline, all through one open of /proc/PID, so that a pid reused
/// between the reads is not taken for the same process. None when it is gone.
pub fn usage(pid: Pid, cmdline_bytes: usize) -> Option<Usage> {
    let process = Process::new(pid as i32).ok()?;
    let stat = process.stat().ok()?;
    let uid = process
        .open_relative("status")
        .ok()
        .and_then(|file| read_up_to(file, 64 * 1024))
        .and_then(|status| effective_uid(&String::from_utf8_lossy(&status)));
    let cmdline = process
        .open_relative("cmdline")
        .ok()
        .and_then(|file| read_up_to(file, cmdline_bytes))
        .and_then(|argv| command_line(&argv));
    Some(Usage {
        start_ticks: stat.starttime,
        comm: stat.comm,
        state: stat.state,
        uid,
        cmdline,
        cpu_ms: ticks_to_ms(stat.utime + stat.stime, procfs::ticks_per_second()),
        rss_bytes: stat.rss.saturating_mul(procfs::page_size()),
    })
}

fn read_up_to(file: std::fs::File, limit: usize) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(limit.min(4096));
    file.take(limit as u64).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The effective uid: the second number of the `Uid:` line (real, effective, saved, fs).
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// argv as one line: the arguments (NUL-separated in /proc) joined by spaces, decoded lossily,
/// every control character a space, so that it cannot move a terminal's cursor. None if empty.
fn command_line(argv: &[u8]) -> Option<String> {
    let text: String = String::from_utf8_lossy(argv)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim_end();
    (!text.is_empty()).then(|| text.to_owned())
}

fn ticks_to_ms(ticks: u64, per_second: u64) -> u64 {
    ticks.saturating_mul(1000) / per_second.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_reads_as_one_line() {
        assert_eq!(
            command_line(b"sh\0-c\0while :; do :; done\0").as_deref(),
            Some("sh -c while :; do :; done")
        );
        assert_eq!(
            command_line(b"a\x1b[2J\nb\xff\0").as_deref(),
            Some("a [2J b\u{fffd}")
        );
        assert_eq!(command_line(b""), None);
        assert_eq!(command_line(b"\0\0"), None);
    }

    #[test]
    fn the_effective_uid_is_the_second() {
        let status = "Name:\tsu\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = usage(std::process::id(), 256).unwrap();
        assert_eq!(me.uid, Some(own_euid()));
        assert!(me.rss_bytes > 0);
        let argv0 = std::env::args().next().unwrap();
        let cmdline = me.cmdline.unwrap();
        assert!(cmdline.len() <= 256);
        assert!(
            argv0.starts_with(cmdline.split(' ').next().unwrap()),
            "{cmdline}"
        );
        assert_eq!(ticks_to_ms(250, 100), 2500);
        assert_eq!(usage(u32::MAX / 2, 256), None);
    }

    /// The test's own effective uid, from the owner of a file it makes.
    fn own_euid() -> u32 {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("leash-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uid = std::fs::metadata(&dir).unwrap().uid();
        std::fs::remove_dir(&dir).unwrap();
        uid
    }
}
