//! The hosts the programs watch for their death (`HOSTS`): a lease's host is put in while the
//! lease holds trees, and taken out when the lease ends, unless the programs took it out first
//! as they reported it dying (`EventKind::HostDying`). Best effort, for speed alone: the host's
//! pidfd and socket still end its lease when the kernel has no room here, or the report is
//! lost.

use leash_common::Pid;

use super::{error::Error, tracker::Tracker};
use crate::proc::{self, ProcessRef};

impl Tracker {
    /// Has the programs report `host`'s death as it begins. A host already there is named
    /// anew: its pid now names this process.
    pub fn watch_host_death(&mut self, host: ProcessRef) -> Result<(), Error> {
        let start_ns = proc::ticks_to_ns(host.start_ticks);
        self.hosts.insert(host.pid, start_ns, 0)?;
        Ok(())
    }

    /// Stops watching `host`: its entry is taken out if it is still this process's (a later
    /// host by the same pid keeps its own).
    pub fn unwatch_host_death(&mut self, host: ProcessRef) {
        let start_ns = proc::ticks_to_ns(host.start_ticks);
        if self.hosts.get(&host.pid, 0).ok() == Some(start_ns) {
            let _ = self.hosts.remove(&host.pid);
        }
    }

    /// Every host watched now.
    pub fn watched_hosts(&self) -> Vec<ProcessRef> {
        let entries: Vec<(Pid, u64)> = self.hosts.iter().filter_map(Result::ok).collect();
        entries
            .into_iter()
            .map(|(pid, start_ns)| ProcessRef {
                pid,
                start_ticks: proc::ns_to_ticks(start_ns),
            })
            .collect()
    }
}
