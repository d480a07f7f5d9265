//! Pids as a client numbers them. A client in a container runs in a pid namespace nested in the
//! daemon's, where every process has another number, and processes outside it have none. Every
//! pid the daemon sends such a client (`registered`, `list`, events) is that client's number
//! for the process, or 0 where its namespace cannot see the process, as the kernel itself
//! reports a process outside the reader's namespace (SO_PEERCRED, getppid, `PPid:` in /proc).
//!
//! A process's numbers come from `NSpid` in /proc/PID/status, which lists them from the
//! daemon's namespace down to the process's own. The client's namespace is the one at the
//! client's own depth. Namespaces are told apart by depth only: the links that name them
//! (/proc/PID/ns/pid) need ptrace rights over the process, which the daemon does not hold, so a
//! process in another namespace nested as deep (a sibling container's), in a tree the client
//! may see, is shown by its number there.

use leash_client::protocol::Event;
use leash_common::Pid;

use crate::proc;

/// How one client numbers processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::daemon) struct PidNumbering {
    /// How deep the client's pid namespace is nested in the daemon's: 0 for the daemon's own.
    depth: usize,
}

impl PidNumbering {
    /// The numbering of the client process `pid` (a number of the daemon's namespace): one number
    /// in its `NSpid` for the daemon's namespace, one more for each nested in it. None if they
    /// cannot be read (it has exited).
    pub(in crate::daemon) fn of_client(pid: Pid) -> Option<Self> {
        let levels = proc::namespace_pids(pid)?.len();
        Some(Self {
            depth: levels.checked_sub(1)?,
        })
    }

    /// How deep the client's namespace is nested in the daemon's.
    pub(in crate::daemon) fn depth(self) -> usize {
        self.depth
    }

    /// The numbering of a client whose namespace is nested `depth` deep in the daemon's.
    #[cfg(test)]
    pub(in crate::daemon) fn nested(depth: usize) -> Self {
        Self { depth }
    }

    /// The client's namespace is the daemon's: its numbers are the daemon's.
    pub(in crate::daemon) fn is_daemons(self) -> bool {
        self.depth == 0
    }

    /// The client's number for the live process `pid`; 0 if it cannot see it (or it is gone).
    pub(in crate::daemon) fn number(self, pid: Pid) -> Pid {
        if self.is_daemons() || pid == 0 {
            return pid;
        }
        proc::namespace_pids(pid).map_or(0, |numbers| self.pick(&numbers))
    }

    /// `event` with its pids as this numbering gives them.
    pub(in crate::daemon) fn number_event(self, event: &Event) -> Event {
        let mut event = event.clone();
        if !self.is_daemons() {
            event.pid = event.pid.map(|pid| self.number(pid));
            event.parent = event.parent.map(|pid| self.number(pid));
        }
        event
    }

    /// The client's number for a process whose numbers in each namespace are `numbers` (its
    /// `NSpid`, read while it ran); 0 if the client cannot see it.
    pub(in crate::daemon) fn pick(self, numbers: &[Pid]) -> Pid {
        numbers.get(self.depth).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_sees_its_own_namespace_and_those_nested_in_it() {
        let container = PidNumbering::nested(1);
        assert_eq!(container.pick(&[4242, 7]), 7, "in the client's namespace");
        assert_eq!(
            container.pick(&[4242, 7, 1]),
            7,
            "in a namespace nested in it"
        );
        assert_eq!(container.pick(&[4242]), 0, "outside it: not visible");
        assert_eq!(
            PidNumbering::default().pick(&[4242, 7]),
            4242,
            "the daemon's own"
        );
    }

    #[test]
    fn this_process_is_in_the_daemons_namespace_of_its_proc() {
        let numbering = PidNumbering::of_client(std::process::id()).unwrap();
        assert!(numbering.is_daemons());
        assert_eq!(numbering.number(std::process::id()), std::process::id());
    }
}
