//! What a kill sends, and to whom: the signal a walk of the member map picks for each member,
//! and the sending, through a handle on the very process a member entry names, so that a
//! recycled pid is never signalled.

use std::io;

use anyhow::Result;
use leash_common::{Member, Pid};

use super::target::KillTarget;
use crate::proc::{self, ProcessRef};

/// What a walk of the members sends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Signal {
    /// SIGKILL to every member not sent it yet.
    Kill,
    /// SIGTERM to every member, but SIGKILL to those that started after the doom (given in
    /// boot-time ns).
    TermOrKillNewborn(u64),
    /// SIGKILL to the members that started after the doom and were not sent it yet.
    KillNewborn(u64),
}

impl Signal {
    /// Its name, for the log.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::TermOrKillNewborn(_) => "term_or_kill_newborn",
            Self::KillNewborn(_) => "kill_newborn",
        }
    }

    /// The signal for `member`, or None to leave it be. `killed`: whether it was sent SIGKILL
    /// already (None: not signalled at all).
    pub(super) fn for_member(self, member: &Member, killed: Option<bool>) -> Option<i32> {
        let newborn = |doomed_ns: u64| member.start_ns >= doomed_ns;
        match (self, killed) {
            (_, Some(true)) => None,
            (Self::Kill, _) => Some(libc::SIGKILL),
            (Self::TermOrKillNewborn(doomed), _) if newborn(doomed) => Some(libc::SIGKILL),
            (Self::TermOrKillNewborn(_), _) => Some(libc::SIGTERM),
            (Self::KillNewborn(doomed), _) if newborn(doomed) => Some(libc::SIGKILL),
            (Self::KillNewborn(_), _) => None,
        }
    }
}

/// Sends `signal` to the member `pid` through a pidfd of the very process its entry `member`
/// names. An entry whose process is gone (one user space put in after its process had exited,
/// or one whose exit the kernel skipped the exit programs for) is taken out: its pid may name
/// an unrelated process by now.
///
/// Returns whether it was signalled; None if it could not be opened now (a shortage of
/// descriptors or memory, say): that is never taken for its being gone.
pub(super) fn signal_member<T: KillTarget>(
    target: &mut T,
    pid: Pid,
    member: Member,
    signal: i32,
) -> Result<Option<bool>> {
    let process = match open_member(target, pid, &member) {
        Ok(Some(process)) => process,
        Ok(None) => {
            target.drop_stale(pid, member)?;
            return Ok(Some(false));
        }
        Err(e) => {
            tracing::debug!(pid, "cannot open a member: {e}");
            return Ok(None);
        }
    };
    Ok(Some(target.send_signal(&process, signal).is_ok()))
}

/// A handle (pidfd) on the process `member`'s entry names, or None if it is gone. The handle
/// is opened first and the process checked after: a process that matches after the open is
/// the one the handle names.
///
/// Where the marks are in place, a mark of the tree on the process the handle names settles it
/// at once.
///
/// An entry the fork program made carries the child's exact start time, and the exit programs
/// take it out when that very process dies, before its pid can be reused: if the entry is still
/// there after the pidfd was opened, the pidfd is that process. That costs one map lookup.
/// Against /proc instead (as [`ProcessRef::open`] does), ten times the cost:
/// - an entry user space made from /proc (a whole number of clock ticks), which may have been
///   put in after its process had exited;
/// - every entry, once the kernel may have skipped both exit programs for some exit (see
///   `program::FORK_AGAIN`): the entry of a process they missed outlives it, its pid free for
///   an unrelated process.
fn open_member<T: KillTarget>(
    target: &T,
    pid: Pid,
    member: &Member,
) -> io::Result<Option<T::Process>> {
    let from_proc = member.start_ns != 0 && member.start_ns.is_multiple_of(proc::ticks_to_ns(1));
    let handle = match target.open(pid) {
        Ok(handle) => handle,
        // No such process; or the pid names a thread now, of some other process.
        Err(e) if proc::is_gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    if target.member(pid) != Some(*member) {
        return Ok(None);
    }
    // A mark of the tree on the very process the handle names: a member, whatever became of
    // its pid (a mark is freed with its process, and only a member's fork or user space makes
    // one). Without one, the checks below.
    if target.marked_in(&handle, member.tree) == Some(true) {
        return Ok(Some(handle));
    }
    // Asked after the lookup: the count of skips only grows.
    if !from_proc && target.every_exit_seen() {
        return Ok(Some(handle));
    }
    let process = ProcessRef::of_member(pid, member);
    let same = target.start_ticks(pid)? == Some(process.start_ticks);
    Ok(same.then_some(handle))
}
