//! Who may do what. The daemon runs as root; its clients usually do not. A client may register
//! only processes it could signal itself (the kill(2) rule), and may see, kill or release only
//! trees whose lease belongs to its uid. Root may do anything.

use std::fs;

use leash_common::Pid;

/// A process's user ids, from /proc/PID/status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessUids {
    pub real: u32,
    pub effective: u32,
    pub saved: u32,
}

impl ProcessUids {
    pub fn of(pid: Pid) -> Option<Self> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Self::parse(&status)
    }

    fn parse(status: &str) -> Option<Self> {
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        let mut ids = line.split_whitespace().map(str::parse::<u32>);
        Some(Self {
            real: ids.next()?.ok()?,
            effective: ids.next()?.ok()?,
            saved: ids.next()?.ok()?,
        })
    }
}

/// kill(2): a sender may signal a target if it is privileged, or if its real or effective uid
/// equals the target's real or saved uid.
pub fn may_signal(sender: ProcessUids, target: ProcessUids) -> bool {
    sender.effective == 0
        || [sender.real, sender.effective]
            .iter()
            .any(|&uid| uid == target.real || uid == target.saved)
}

/// Whether a client of `uid` may see, kill or release a tree owned by `owner`.
pub fn may_manage(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uids(real: u32, effective: u32, saved: u32) -> ProcessUids {
        ProcessUids {
            real,
            effective,
            saved,
        }
    }

    #[test]
    fn the_kill_rules() {
        let alice = uids(1000, 1000, 1000);
        assert!(may_signal(alice, alice));
        assert!(
            !may_signal(alice, uids(0, 0, 0)),
            "a user may not register root's process"
        );
        assert!(!may_signal(alice, uids(1001, 1001, 1001)));
        // A setuid program run by alice keeps alice as its real uid: she may signal it.
        assert!(may_signal(alice, uids(1000, 0, 0)));
        // A process that dropped to alice's uid but saved root's: real uid matches.
        assert!(may_signal(alice, uids(1000, 1000, 0)));
        // Alice's effective uid against a target whose saved uid is hers.
        assert!(may_signal(alice, uids(1001, 1001, 1000)));
        assert!(may_signal(uids(0, 0, 0), alice), "root may signal anyone");
    }

    #[test]
    fn trees_belong_to_their_uid() {
        assert!(may_manage(1000, 1000));
        assert!(!may_manage(1000, 1001));
        assert!(may_manage(0, 1001));
    }

    #[test]
    fn status_parsing() {
        let status = "Name:\tsleep\nUid:\t1000\t1001\t1002\t1003\nGid:\t0\t0\t0\t0\n";
        assert_eq!(ProcessUids::parse(status), Some(uids(1000, 1001, 1002)));
        assert_eq!(ProcessUids::parse("Name: x\n"), None);
        assert_eq!(ProcessUids::parse("Uid:\tx\t1\t2\n"), None);
        assert!(ProcessUids::of(std::process::id()).is_some());
    }
}
