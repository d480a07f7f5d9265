//! What `list` shows of each listed member beyond the map's entry (its user, command line, CPU
//! time and resident memory, from /proc), and of each tree (the sums). Read by the daemon,
//! which sees every pid namespace, for clients that may not read /proc themselves.

use leash_client::protocol::{MAX_CMDLINE_BYTES, MemberInfo, TreeInfo};
use leash_common::{Member, Pid};

use crate::{daemon::rules::pid_numbering::PidNumbering, proc};

/// A listed member: its entry in the map, with what /proc says of it now. A process by that pid
/// that started at another time is not the member (it exited, and the pid was given again
/// before the map forgot it): it shows as gone.
pub(in crate::daemon) fn of_member(
    pid: Pid,
    member: &Member,
    numbering: PidNumbering,
) -> MemberInfo {
    let usage = proc::usage(pid, MAX_CMDLINE_BYTES).filter(|usage| {
        let process = proc::ProcessRef {
            pid,
            start_ticks: usage.start_ticks,
        };
        process.is(member)
    });
    let mut info = MemberInfo {
        pid: numbering.number(pid),
        parent: numbering.number(member.parent),
        start_ns: member.start_ns,
        comm: None,
        uid: None,
        state: None,
        cmdline: None,
        cpu_ms: None,
        rss_bytes: None,
    };
    if let Some(usage) = usage {
        info.comm = Some(usage.comm);
        info.uid = usage.uid;
        info.state = Some(usage.state);
        info.cmdline = usage.cmdline;
        info.cpu_ms = Some(usage.cpu_ms);
        info.rss_bytes = Some(usage.rss_bytes);
    }
    info
}

/// Sets the tree's CPU time and resident memory to the sums over its listed members (those
/// gone count nothing). With all its members listed these are the tree's own; with
/// `members_truncated`, of the listed ones only: reading every member of a large tree is what
/// the bound on `list` is there to avoid.
pub(in crate::daemon) fn add_up(tree: &mut TreeInfo) {
    let members = &tree.members;
    tree.cpu_ms = Some(members.iter().filter_map(|m| m.cpu_ms).sum());
    tree.rss_bytes = Some(members.iter().filter_map(|m| m.rss_bytes).sum());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_reads_as_itself_and_a_stranger_by_its_pid_as_gone() {
        let me = std::process::id();
        let start_ns = proc::ticks_to_ns(proc::process(me).unwrap().start_ticks);
        let member = Member {
            tree: 1,
            parent: 1,
            start_ns,
        };
        let info = of_member(me, &member, PidNumbering::default());
        assert_eq!(info.pid, me);
        assert!(info.comm.is_some() && info.cmdline.is_some());
        assert!(info.rss_bytes.is_some_and(|rss| rss > 0));

        let later = Member {
            start_ns: start_ns + 10_000_000_000,
            ..member
        };
        let stranger = of_member(me, &later, PidNumbering::default());
        assert_eq!((stranger.comm, stranger.cpu_ms), (None, None));
    }
}
