//! The tracker: the programs, loaded and attached, and the maps it writes; what it hands to
//! other threads (a view of the maps, the whois iterator, the ring buffer's descriptor).

use std::{fmt, ops::Deref, os::fd::OwnedFd};

use anyhow::Result;
use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf},
};
use leash_common::{Account, Member, Pid, TreeId};

use super::{
    pins::Pins,
    ptrace_guard::{self, Guard},
    record::TreeEvent,
    view::TrackerView,
    whois::Whois,
};

/// The loaded, attached programs and their maps. Dropping an unpinned tracker detaches and
/// unloads everything; a pinned one leaves its programs following forks into the pinned maps
/// until [`Tracker::unpin`].
pub struct Tracker {
    /// The maps clients read, which the tracker writes through too.
    pub(super) view: TrackerView,
    pub(super) events: RingBuf<MapData>,
    pub(super) account_joined: HashMap<MapData, Account, i64>,
    pub(super) account_seeded: HashMap<MapData, Account, i64>,
    /// Hosts watched for their death (see hosts.rs), with their start times.
    pub(super) hosts: HashMap<MapData, Pid, u64>,
    pub(super) next_tree: TreeId,
    pub(super) pins: Option<Pins>,
    pub(super) whois: std::sync::Arc<Whois>,
    /// The ptrace guard in place (pinned, or held below).
    pub(super) guard: Guard,
    /// The guard's links this process holds: all of them unpinned, or those the kernel cannot
    /// pin (classic tracepoints before Linux 5.15).
    pub(super) _guard_links: Vec<ptrace_guard::HeldLink>,
    // Holds the programs and (unpinned) their links. None when taken over from pins: the
    // pinned links hold the programs then.
    pub(super) _programs: Option<Ebpf>,
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("capacity", &self.view.capacity())
            .finish_non_exhaustive()
    }
}

/// The tracker reads through its own view, so every read is written once, in [`TrackerView`],
/// and `tracker.tree_status(tree)` reads the same as `view.tree_status(tree)`. Writes go
/// through `self.view`'s maps explicitly: a view hands out no way to write.
impl Deref for Tracker {
    type Target = TrackerView;

    fn deref(&self) -> &TrackerView {
        &self.view
    }
}

impl Tracker {
    /// Removes the pins (a clean shutdown): the programs detach when this tracker is dropped.
    pub fn unpin(&mut self) -> Result<()> {
        match self.pins.take() {
            Some(pins) => pins.remove(),
            None => Ok(()),
        }
    }

    /// The ptrace guard in place.
    pub fn ptrace_guard(&self) -> Guard {
        self.guard
    }

    /// Where the pins are, if this tracker is pinned.
    pub fn pin_dir(&self) -> Option<&std::path::Path> {
        self.pins.as_ref().map(Pins::dir)
    }

    /// What the kernel knows of a process that /proc does not tell (its namespaces), for any
    /// thread to ask.
    pub fn whois(&self) -> std::sync::Arc<Whois> {
        self.whois.clone()
    }

    /// A view of the maps for readers on other threads: new descriptors of the same maps, so
    /// it sees every write the tracker makes, at once, and needs no lock.
    pub fn shared_view(&self) -> Result<TrackerView> {
        self.view.duplicate()
    }

    /// Takes every event waiting in the ring buffer, and keeps the index of each tree's pids
    /// up to date with them. Best effort: see `Stats::events_dropped`.
    pub fn drain_events(&mut self) -> Vec<TreeEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            events.extend(TreeEvent::decode(&item));
        }
        let TrackerView { members, index, .. } = &mut self.view;
        index.take_records(&events, |pid| members.get(&pid, 0).ok());
        events
    }

    /// The members of `tree` the index of each tree's pids knows of, each looked up in the
    /// map now (see [`MemberIndex::members_of`](super::index::MemberIndex::members_of)).
    pub(super) fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)> {
        let TrackerView { members, index, .. } = &mut self.view;
        index.members_of(tree, |pid| members.get(&pid, 0).ok())
    }

    /// Sets the index's pids of `tree` to those a walk of the map just found.
    pub(super) fn reindex(&mut self, tree: TreeId, found: &[(Pid, Member)]) {
        self.view
            .index
            .replace(tree, found.iter().map(|&(pid, _)| pid));
    }

    /// A descriptor that polls readable when events are waiting (a duplicate of the ring
    /// buffer's, so it can be watched without holding the tracker).
    pub fn events_fd(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.events.as_fd().try_clone_to_owned()
    }
}
