//! Who a process runs as, read from /proc, so the harness can check that its relay is not root.

use std::{fs, io};

/// A process's uids and gids (real, effective, saved, filesystem) and supplementary groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
    pub groups: Vec<u32>,
}

impl Credentials {
    /// Those of `process`: a pid, or `self`.
    pub fn of(process: &str) -> io::Result<Self> {
        let status = fs::read_to_string(format!("/proc/{process}/status"))?;
        Self::parse(&status).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no Uid, Gid or Groups line in /proc/{process}/status"),
            )
        })
    }

    fn parse(status: &str) -> Option<Self> {
        let ids = |name: &str| -> Option<Vec<u32>> {
            let line = status.lines().find_map(|line| line.strip_prefix(name))?;
            line.split_whitespace().map(|id| id.parse().ok()).collect()
        };
        Some(Self {
            uids: ids("Uid:")?,
            gids: ids("Gid:")?,
            groups: ids("Groups:")?,
        })
    }

    /// Runs as `uid` (and the group of the same number) and nothing else: every uid and gid is
    /// that one, and there are no supplementary groups.
    pub fn are_only(&self, uid: u32) -> bool {
        self.uids.len() == 4
            && self.gids.len() == 4
            && self.uids.iter().chain(&self.gids).all(|&id| id == uid)
            && self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_not_an_unprivileged_uid() {
        let status = "Name:\tx\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n";
        let root = Credentials::parse(status).unwrap();
        assert!(root.are_only(0));
        assert!(!root.are_only(61003));
        let relay = "Uid:\t61003\t61003\t61003\t61003\nGid:\t61003\t61003\t61003\t61003\nGroups:\n";
        assert!(Credentials::parse(relay).unwrap().are_only(61003));
        let saved_root =
            "Uid:\t61003\t61003\t0\t61003\nGid:\t61003\t61003\t61003\t61003\nGroups:\n";
        assert!(!Credentials::parse(saved_root).unwrap().are_only(61003));
        let with_groups =
            "Uid:\t61003\t61003\t61003\t61003\nGid:\t61003\t61003\t61003\t61003\nGroups:\t0\n";
        assert!(!Credentials::parse(with_groups).unwrap().are_only(61003));
    }
}
