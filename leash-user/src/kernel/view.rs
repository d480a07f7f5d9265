//! What the kernel maps say, read without the tracker. A [`TrackerView`] holds its own
//! descriptors of the maps clients read (members, tree control, tree counters, stats), so any
//! thread can read them while the tracker's owner goes on writing: the kernel serializes map
//! operations, and every read here is a snapshot of one moment, as it was under a lock.

use std::{collections::HashMap as StdHashMap, sync::Arc};

use anyhow::{Context, Result, anyhow};
use aya::maps::{HashMap, IterableMap, Map, MapData, MapError, PerCpuArray};
use leash_common::{Holder, Member, Pid, TreeControl, TreeCounters, TreeId, stat};

use super::{
    index::MemberIndex,
    skips::ProgramSkips,
    types::{Capacity, MemberInfo, Stats, TreeStatus},
};
use crate::{
    proc::{self, Descendants, ProcessInfo, Visit, WalkCounts},
    sys,
};

/// The read side of the tracker's maps. Made by the tracker ([`super::Tracker::shared_view`]),
/// it reads the very maps the tracker writes, with no lock: it can be shared across threads.
pub struct TrackerView {
    pub(super) members: HashMap<MapData, Pid, Member>,
    /// The member map again, for batch reads (aya has none).
    member_reader: sys::HashMapReader<Pid, Member>,
    pub(super) counters: HashMap<MapData, TreeId, TreeCounters>,
    pub(super) control: HashMap<MapData, TreeId, TreeControl>,
    stats: PerCpuArray<MapData, u64>,
    capacity: Capacity,
    /// Each tree's pids, a hint for the kill (see [`MemberIndex`]). Kept by the tracker alone,
    /// in its own view, as it writes the maps and reads the records: a duplicate's stays empty.
    pub(super) index: MemberIndex,
    /// How often the kernel skipped each program, shared by every view of the same programs.
    skips: Arc<ProgramSkips>,
}

// Views are handed to other threads; a change in aya that made that impossible must not compile.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<TrackerView>();
};

impl std::fmt::Debug for TrackerView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackerView")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl TrackerView {
    pub(super) fn new(
        members: Map,
        counters: Map,
        control: Map,
        stats: Map,
        capacity: Capacity,
        skips: Arc<ProgramSkips>,
    ) -> Result<Self> {
        let Map::HashMap(data) = &members else {
            anyhow::bail!("the member map is not a hash map");
        };
        Ok(Self {
            member_reader: sys::HashMapReader::new(data)
                .context("opening the member map for batch reads")?,
            members: HashMap::try_from(members)?,
            counters: HashMap::try_from(counters)?,
            control: HashMap::try_from(control)?,
            stats: PerCpuArray::try_from(stats)?,
            capacity,
            index: MemberIndex::default(),
            skips,
        })
    }

    /// Another view of the same maps, through new descriptors.
    pub(super) fn duplicate(&self) -> Result<Self> {
        Self::new(
            duplicate(self.members.map())?,
            duplicate(self.counters.map())?,
            duplicate(self.control.map())?,
            duplicate(self.stats.map())?,
            self.capacity,
            self.skips.clone(),
        )
    }

    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// The member entry for `pid`, if it is tracked.
    pub fn member(&self, pid: Pid) -> Option<Member> {
        self.members.get(&pid, 0).ok()
    }

    /// Every member of `tree` now, oldest first, without reading /proc: `comm` is None (see
    /// [`fill_comms`]). Walks the whole member map: O(all members).
    pub fn members(&self, tree: TreeId) -> Result<Vec<MemberInfo>> {
        let mut found: Vec<MemberInfo> = self
            .member_entries()?
            .into_iter()
            .filter(|(_, member)| member.tree == tree)
            .map(|(pid, member)| MemberInfo {
                pid,
                parent: member.parent,
                start_ns: member.start_ns,
                comm: None,
            })
            .collect();
        found.sort_by_key(|m| (m.start_ns, m.pid));
        Ok(found)
    }

    /// How many members each tree has, in one walk of the member map.
    pub fn member_counts(&self) -> Result<StdHashMap<TreeId, u64>> {
        let mut counts = StdHashMap::new();
        for (_, member) in self.member_entries()? {
            *counts.entry(member.tree).or_default() += 1;
        }
        Ok(counts)
    }

    /// Every entry of the member map now. A member that exits during the walk is left out.
    /// Takes `pid`'s entry out and returns it, in one step (see
    /// [`sys::HashMapReader::take`]).
    pub(super) fn take_member(&self, pid: Pid) -> std::io::Result<Option<Member>> {
        self.member_reader.take(&pid)
    }

    pub fn member_entries(&self) -> Result<Vec<(Pid, Member)>> {
        match self.member_reader.entries() {
            Ok(entries) => return Ok(entries),
            // Before Linux 5.6: walk the keys instead.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            Err(e) => return Err(e).context("reading the member map"),
        }
        let mut entries = Vec::new();
        for entry in self.members.iter() {
            match entry {
                Ok(entry) => entries.push(entry),
                Err(MapError::KeyNotFound) => continue,
                Err(e) => return Err(e).context("reading the member map"),
            }
        }
        Ok(entries)
    }

    /// The pids of `tree`'s members, without reading /proc.
    pub fn member_pids(&self, tree: TreeId) -> Result<Vec<Pid>> {
        Ok(self
            .member_entries()?
            .into_iter()
            .filter(|(_, m)| m.tree == tree)
            .map(|(pid, _)| pid)
            .collect())
    }

    /// Whether `tree` has no members. The kernel's count says so cheaply; the map walk
    /// confirms it (the map is the truth).
    pub fn is_empty(&self, tree: TreeId) -> Result<bool> {
        Ok(self.tree_status(tree)?.members == 0 && self.member_pids(tree)?.is_empty())
    }

    /// The members of `trees`, from the kernel's per-tree counters: two lookups a tree,
    /// whatever their sizes. A tree that cannot be read counts none.
    pub fn members_of(&self, trees: &[TreeId]) -> u64 {
        trees
            .iter()
            .filter_map(|&tree| self.tree_status(tree).ok())
            .map(|status| status.members)
            .sum()
    }

    /// The kernel's account of `tree`.
    pub fn tree_status(&self, tree: TreeId) -> Result<TreeStatus> {
        let control = self
            .control
            .get(&tree, 0)
            .map_err(|_| anyhow!("no tree {tree}"))?;
        let counters = self
            .counters
            .get(&tree, 0)
            .map_err(|_| anyhow!("no counters for tree {tree}"))?;
        // seeded and left race (a seeded member may leave before seeded is written): clamp.
        let members = u64::try_from(
            (i128::from(control.seeded) + i128::from(counters.joined) - i128::from(counters.left))
                .max(0),
        )
        .unwrap_or(u64::MAX);
        Ok(TreeStatus {
            tree,
            root: control.root,
            members,
            seeded: control.seeded,
            joined: counters.joined,
            left: counters.left,
            failed_inserts: counters.failed,
            over_quota: counters.over_quota,
            root_exit_ns: (counters.root_exit_ns != 0).then_some(counters.root_exit_ns),
            doomed_ns: (control.flags & leash_common::flags::DOOMED != 0)
                .then_some(control.doomed_ns),
            parent: (control.parent != 0).then_some(control.parent),
        })
    }

    /// Every registered tree.
    pub fn trees(&self) -> Vec<TreeId> {
        let mut trees: Vec<TreeId> = self.control.keys().filter_map(Result::ok).collect();
        trees.sort_unstable();
        trees
    }

    /// How often the kernel skipped each attached program (see [`ProgramSkips`]).
    pub fn program_skips(&self) -> Vec<(&'static str, u64)> {
        self.skips.counts()
    }

    /// How often the kernel skipped the fork programs so far (see
    /// [`ProgramSkips::fork_misses`]).
    pub fn fork_misses(&self) -> u64 {
        self.skips.fork_misses()
    }

    /// See [`ProgramSkips::every_exit_seen`].
    pub(super) fn every_exit_seen(&self) -> bool {
        self.skips.every_exit_seen()
    }

    pub fn stats(&self) -> Result<Stats> {
        let sum = |index: u32| -> Result<u64> {
            let values = self.stats.get(&index, 0).context("reading stats")?;
            Ok(values.iter().sum())
        };
        Ok(Stats {
            joins: sum(stat::JOINS)?,
            exits: sum(stat::EXITS)?,
            inserts_failed: sum(stat::INSERTS_FAILED)?,
            events_dropped: sum(stat::EVENTS_DROPPED)?,
            reconciled: sum(stat::RECONCILED)?,
            forks_refused: sum(stat::FORKS_REFUSED)?,
        })
    }

    /// The trees nested directly in `tree`.
    pub fn nested(&self, tree: TreeId) -> Vec<TreeId> {
        self.control
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, control)| control.parent == tree)
            .map(|(nested, _)| nested)
            .collect()
    }

    /// `tree` and every tree it is nested in, innermost first.
    pub fn enclosing(&self, tree: TreeId) -> Vec<TreeId> {
        let mut chain = vec![tree];
        let mut at = tree;
        // Bounded: a chain cannot be longer than the number of trees.
        while chain.len() <= self.capacity.trees as usize {
            match self.control.get(&at, 0) {
                Ok(control) if control.parent != 0 && !chain.contains(&control.parent) => {
                    at = control.parent;
                    chain.push(at);
                }
                _ => break,
            }
        }
        chain
    }

    /// Who holds `tree`, as recorded (zero when nobody recorded it).
    pub fn holder(&self, tree: TreeId) -> Result<Holder> {
        Ok(self
            .control
            .get(&tree, 0)
            .map_err(|_| anyhow!("no tree {tree}"))?
            .holder)
    }

    /// One pass of an adoption's search (see [`super::Adoption`]): the descendants of `root`
    /// that are not members of `tree` yet, read from the children files of /proc from `root`
    /// down. Below a member of another tree the walk stops, since that tree follows its own;
    /// members of the tree `tree` is nested in are walked through and found (they come down
    /// into `tree`); members of `tree` are walked through. Reads only, so it can run on any
    /// thread; [`super::Tracker::seed_found`] puts what it found in, checking each process
    /// again.
    pub fn find_descendants(&self, tree: TreeId, root: Pid) -> Result<Descendants> {
        Ok(proc::descendants_of(root, self.adoption_visit(tree)?))
    }

    /// [`TrackerView::find_descendants`], handing what it finds to `deliver` `batch` at a
    /// time as the walk goes on (see [`proc::descendants_in_batches`]), so that seeding can
    /// begin before the walk ends.
    pub fn find_descendants_in_batches(
        &self,
        tree: TreeId,
        root: Pid,
        batch: usize,
        deliver: impl FnMut(Vec<ProcessInfo>) -> bool,
    ) -> Result<WalkCounts> {
        let visit = self.adoption_visit(tree)?;
        Ok(proc::descendants_in_batches(root, visit, batch, deliver))
    }

    /// How an adoption's walk for `tree` treats each process it meets, by the tree that holds
    /// it.
    fn adoption_visit(&self, tree: TreeId) -> Result<impl Fn(Pid) -> Visit + '_> {
        let enclosing = self.tree_status(tree)?.parent;
        // A lookup per process met, when the walk meets it: one system call each, against
        // reading the whole member map (every tree's members) into memory for each pass. For a
        // tree of 100k in a map of 100k, the batch read would be a little cheaper in time (a
        // few hundred entries per call), but the lookups cost far less than the /proc reads
        // each process needs anyway (a few system calls each, and a stat to format), and they
        // keep a pass's time and memory in proportion to its own tree, however many other
        // members the machine holds.
        Ok(
            move |pid| match self.member(pid).map(|member| member.tree) {
                None => Visit::Find,
                Some(held) if held == tree => Visit::Through,
                Some(held) if Some(held) == enclosing => Visit::Find,
                Some(_) => Visit::Stop,
            },
        )
    }
}

/// Fills in each member's command name from /proc: None for one gone meanwhile, or whose pid
/// names another process by now. Reads one file per member: call it outside any lock, off the
/// tracker's owner.
pub fn fill_comms(members: &mut [MemberInfo]) {
    for member in members {
        member.comm = proc::process(member.pid)
            .filter(|p| p.start_ticks == proc::ns_to_ticks(member.start_ns))
            .map(|p| p.comm);
    }
}

/// A map of its own for the map `data` names, through a new descriptor.
fn duplicate(data: &MapData) -> Result<Map> {
    use std::os::fd::AsFd;
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating a map descriptor")?;
    Ok(Map::from_map_data(MapData::from_fd(fd)?)?)
}
