//! Why a lease ended: the `reason` of its `lease_ended` log line, whose words DEPLOY.md lists
//! for those who search the journal by them.

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::daemon) enum LeaseEnd {
    /// The kernel saw the host start to die: a fatal signal, the OOM killer, a crash.
    HostKilled,
    /// The host exited.
    HostExited,
    /// The host closed its connection, and lives on.
    ConnectionClosed,
    /// The connection failed.
    ConnectionError,
    /// The client left its replies unread.
    ClientNotReading,
    /// The host of a lease taken over from the previous daemon died while no daemon ran.
    HostExitedWhileAway,
    /// The host could not be watched.
    HostUnwatchable,
}

impl LeaseEnd {
    /// Every reason, in the order above (for the check against DEPLOY.md).
    #[cfg(test)]
    pub(in crate::daemon) const ALL: [LeaseEnd; 7] = [
        Self::HostKilled,
        Self::HostExited,
        Self::ConnectionClosed,
        Self::ConnectionError,
        Self::ClientNotReading,
        Self::HostExitedWhileAway,
        Self::HostUnwatchable,
    ];

    /// Its word in the log.
    pub(in crate::daemon) fn as_str(self) -> &'static str {
        match self {
            Self::HostKilled => "host_killed",
            Self::HostExited => "host_exited",
            Self::ConnectionClosed => "connection_closed",
            Self::ConnectionError => "connection_error",
            Self::ClientNotReading => "client_not_reading",
            Self::HostExitedWhileAway => "host_exited_while_away",
            Self::HostUnwatchable => "host_unwatchable",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DEPLOY.md's row for the `lease_ended` line names exactly these words.
    #[test]
    fn deploy_md_lists_every_reason_a_lease_ends_with() {
        let deploy = include_str!("../../../../docs/DEPLOY.md");
        let row = deploy
            .lines()
            .find(|line| line.starts_with("| `lease_ended` |"))
            .expect("DEPLOY.md has a row for lease_ended");
        let (_, reasons) = row
            .split_once("`reason`:")
            .expect("the row lists the reasons");
        let listed: Vec<&str> = reasons.split('`').skip(1).step_by(2).collect();
        let ours: Vec<&str> = LeaseEnd::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(listed, ours, "DEPLOY.md lists them in the enum's order");
    }
}
