//! The kernel side, seen from user space: load and attach the programs, and typed views of their
//! maps. [`Tracker`] writes them (register trees, kill, release); [`TrackerView`] reads them
//! (members, counters), from any thread.

pub mod btf;
mod error;
mod kill;
mod pins;
pub mod ptrace_guard;
mod register;
pub mod support;
mod view;
pub mod whois;

use std::{fmt, mem::offset_of, ops::Deref, os::fd::OwnedFd};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, Map, MapData, RingBuf},
    programs::{BtfTracePoint, Iter, links::FdLink},
};
use leash_common::{
    ALL_ACCOUNTS, Account, Event, EventKind, Holder, MEMBER_RESERVE, Member, NO_LIMIT, Pid,
    TreeControl, TreeCounters, TreeId, global, map, program,
};

use crate::{proc, sys};

pub use error::Error;
pub use kill::{KILL_ROUNDS_TIMEOUT, Kill, KillError, KillReport, KillStep, SIGNALS_PER_STEP};
pub use pins::Pins;
pub use ptrace_guard::{Guard, GuardChoice};
pub use register::{Adoption, IdentifyError, identify, identify_pidfd};
pub use view::{TrackerView, fill_comms};
pub use whois::{Identity, UserNamespace, Whois};

/// The compiled programs, embedded at build time by build.rs.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leash-ebpf"));

/// The programs `Tracker::load` attaches, and where: each to a BTF-typed tracepoint (tp_btf).
pub const PROGRAMS_ATTACHED: [(&str, &str); 3] = [
    (program::FORK, "tp_btf/sched_process_fork"),
    (program::EXIT, "tp_btf/sched_process_exit"),
    (program::EXEC, "tp_btf/sched_process_exec"),
];

/// Map capacities, fixed when the programs are loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Processes tracked at once, over all trees. A child forked past it is still tracked (the
    /// map keeps a reserve beyond it: `leash_common::MEMBER_RESERVE`), its forker is killed,
    /// and it counts as a failed insert of its tree, which is killed as untrackable.
    pub members: u32,
    /// Trees registered at once.
    pub trees: u32,
    /// Bytes of the event ring buffer (a power of two, at least a page).
    pub event_bytes: u32,
    /// Members one non-root uid may have at once, over all its trees, so that no user can
    /// fill the map that every user's trees share. None: no limit. A fork beyond it gets the
    /// tree killed.
    pub members_per_uid: Option<u32>,
    /// Which ptrace guard to attach (see [`ptrace_guard`]).
    pub ptrace_guard: GuardChoice,
}

impl Capacity {
    /// The per-uid member quota when none is given: an eighth of the map.
    pub fn default_members_per_uid(members: u32) -> u32 {
        (members / 8).max(1)
    }
}

impl Default for Capacity {
    fn default() -> Self {
        let members = 131_072;
        Self {
            members,
            trees: 4096,
            event_bytes: 1 << 20,
            members_per_uid: Some(Self::default_members_per_uid(members)),
            ptrace_guard: GuardChoice::Auto,
        }
    }
}

/// One tracked process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub pid: Pid,
    /// The process that forked it (for a registered process: its parent at registration).
    pub parent: Pid,
    /// Start time, nanoseconds since boot (clock-tick resolution for registered processes).
    pub start_ns: u64,
    /// What the process is now (/proc/PID/comm), once [`fill_comms`] has read it; None before,
    /// or if it is gone.
    pub comm: Option<String>,
}

/// What the kernel knows about one tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeStatus {
    pub tree: TreeId,
    pub root: Pid,
    /// Members now: seeded + joined - left.
    pub members: u64,
    /// Put in by user space (the root, and descendants found in /proc at registration), less
    /// those it took out.
    pub seeded: i64,
    /// Joined at fork, in the kernel.
    pub joined: u64,
    /// Left at exit, in the kernel.
    pub left: u64,
    /// Children that could not be tracked because the member map was full.
    pub failed_inserts: u64,
    /// Forks made while the tree's owner had its whole member quota.
    pub over_quota: u64,
    /// When the root's thread group died (ns since boot), if it has.
    pub root_exit_ns: Option<u64>,
    /// When the tree was first doomed (ns since boot), if it has been.
    pub doomed_ns: Option<u64>,
    /// The tree it is nested in, if any.
    pub parent: Option<TreeId>,
}

/// Global counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub joins: u64,
    pub exits: u64,
    pub inserts_failed: u64,
    pub events_dropped: u64,
}

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEvent {
    pub kind: EventKind,
    pub tree: TreeId,
    pub pid: Pid,
    pub parent: Pid,
    pub time_ns: u64,
    /// The command name the event carries (see [`Event::comm`]).
    pub comm: String,
}

impl TreeEvent {
    /// Reads an [`Event`] record field by field: no alignment or validity assumptions.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let u32_at = |offset: usize| {
            Some(u32::from_ne_bytes(
                bytes.get(offset..offset + 4)?.try_into().ok()?,
            ))
        };
        let time = bytes.get(offset_of!(Event, time_ns)..offset_of!(Event, time_ns) + 8)?;
        let comm = bytes.get(offset_of!(Event, comm)..offset_of!(Event, comm) + 16)?;
        let comm = comm.split(|&b| b == 0).next().unwrap_or_default();
        Some(Self {
            kind: EventKind::from_u32(u32_at(offset_of!(Event, kind))?)?,
            tree: u32_at(offset_of!(Event, tree))?,
            pid: u32_at(offset_of!(Event, pid))?,
            parent: u32_at(offset_of!(Event, parent))?,
            time_ns: u64::from_ne_bytes(time.try_into().ok()?),
            comm: String::from_utf8_lossy(comm).into_owned(),
        })
    }
}

/// Where a pinned tracker's programs and maps came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Loaded and attached now, and pinned.
    Loaded,
    /// Taken over from the pins a previous daemon left: its programs never stopped.
    TakenOver,
}

/// The loaded, attached programs and their maps. Dropping an unpinned tracker detaches and
/// unloads everything; a pinned one leaves its programs following forks into the pinned maps
/// until [`Tracker::unpin`].
pub struct Tracker {
    /// The maps clients read, which the tracker writes through too.
    view: TrackerView,
    events: RingBuf<MapData>,
    account_joined: HashMap<MapData, Account, i64>,
    account_seeded: HashMap<MapData, Account, i64>,
    next_tree: TreeId,
    pins: Option<Pins>,
    whois: std::sync::Arc<Whois>,
    /// The ptrace guard in place (pinned, or held below).
    guard: Guard,
    /// The guard's links this process holds: all of them unpinned, or those the kernel cannot
    /// pin (classic tracepoints before Linux 5.15).
    _guard_links: Vec<ptrace_guard::HeldLink>,
    // Holds the programs and (unpinned) their links. None when taken over from pins: the
    // pinned links hold the programs then.
    _programs: Option<Ebpf>,
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
    /// Loads the programs with the kernel's offsets and attaches them. Needs root (or
    /// CAP_BPF + CAP_PERFMON) and a kernel with BTF.
    pub fn load(capacity: Capacity) -> Result<Self> {
        let attached = Attached::load(capacity)?;
        let whois = link_fd(&attached.whois)?;
        let guard_links = attached.guard_links.into_iter().map(|(_, link)| link);
        Self::from_programs(
            attached.ebpf,
            whois,
            capacity,
            None,
            (attached.guard, guard_links.collect()),
        )
    }

    /// Like [`Tracker::load`], with the links and maps pinned under `root`, so tracking goes on
    /// if this process dies. If a previous process left its pins there, takes them over
    /// instead: its programs and maps, with every tree and member they hold (`capacity` is
    /// then theirs).
    pub fn load_pinned(capacity: Capacity, root: &std::path::Path) -> Result<(Self, Origin)> {
        let mut pins = Pins::at(root)?;
        for other in pins.other_versions() {
            tracing::warn!(
                pins = %other.display(),
                "pins of another version of leash's programs and maps: this daemon cannot read \
                 them, so their trees are followed but not enforced. An upgrade that changes \
                 that version is not a hand-over: stop the old daemon first (its trees are \
                 killed). Removing these pins lets their trees go"
            );
        }
        if pins.complete() {
            // The previous programs are still attached: loading more beside them would count
            // every fork twice, so failing here is the only safe answer.
            let dir = pins.dir().to_path_buf();
            let taken = pins.open_links().and_then(|()| Self::take_over(pins));
            return taken
                .map(|tracker| (tracker, Origin::TakenOver))
                .with_context(|| {
                    format!(
                        "taking over the pins in {0}; to start afresh, remove it (rm -r {0}): the \
                     trees it holds are then no longer tracked",
                        dir.display()
                    )
                });
        }
        if pins.exist() {
            tracing::warn!(
                dir = %pins.dir().display(),
                "removing incomplete pins (a daemon died while pinning)"
            );
            pins.remove()?;
            pins = Pins::at(root)?;
        }
        let (ebpf, whois_link, guard) = match Attached::load(capacity)?.pin(&mut pins) {
            Ok(pinned) => pinned,
            Err(e) => {
                // Half-pinned programs would go on running with nobody to read their maps.
                let _ = pins.remove();
                return Err(e);
            }
        };
        tracing::info!(dir = %pins.dir().display(), "programs and maps pinned");
        Ok((
            Self::from_programs(ebpf, whois_link, capacity, Some(pins), guard)?,
            Origin::Loaded,
        ))
    }

    fn from_programs(
        mut ebpf: Ebpf,
        whois_link: OwnedFd,
        capacity: Capacity,
        pins: Option<Pins>,
        (guard, guard_links): GuardInPlace,
    ) -> Result<Self> {
        tracing::info!(?guard, "{}", guard.describe());
        let whois = Whois::new(whois_link, take_map(&mut ebpf, map::WHOIS)?)?;
        let mut tracker = Self {
            view: TrackerView::new(
                take_map(&mut ebpf, map::MEMBERS)?,
                take_map(&mut ebpf, map::TREE_COUNTERS)?,
                take_map(&mut ebpf, map::TREE_CONTROL)?,
                take_map(&mut ebpf, map::STATS)?,
                capacity,
            )?,
            events: RingBuf::try_from(take_map(&mut ebpf, map::EVENTS)?)?,
            account_joined: HashMap::try_from(take_map(&mut ebpf, map::ACCOUNT_JOINED)?)?,
            account_seeded: HashMap::try_from(take_map(&mut ebpf, map::ACCOUNT_SEEDED)?)?,
            next_tree: 1,
            pins,
            whois: whois.into(),
            guard,
            _guard_links: guard_links,
            _programs: Some(ebpf),
        };
        // Every member counts here: the programs only ever add to an existing entry.
        tracker
            .account_joined
            .insert(ALL_ACCOUNTS, 0, BPF_NOEXIST)?;
        tracker
            .account_seeded
            .insert(ALL_ACCOUNTS, 0, BPF_NOEXIST)?;
        Ok(tracker)
    }

    fn take_over(pins: Pins) -> Result<Self> {
        let max_entries = |map: &Map| -> Result<u32> {
            let data: &MapData = match map {
                Map::HashMap(data) | Map::RingBuf(data) => data,
                _ => bail!("unexpected pinned map type"),
            };
            Ok(data.info()?.max_entries())
        };
        let members = pins.open_map(map::MEMBERS)?;
        let control = pins.open_map(map::TREE_CONTROL)?;
        let events = pins.open_map(map::EVENTS)?;
        let capacity = Capacity {
            members: max_entries(&members)?.saturating_sub(MEMBER_RESERVE),
            trees: max_entries(&control)?,
            event_bytes: max_entries(&events)?,
            // Set in the pinned programs, which do not say it back.
            members_per_uid: None,
            ptrace_guard: GuardChoice::Auto,
        };
        let guard = pins.guard();
        if guard == Guard::Absent {
            tracing::warn!(
                "the previous daemon left no ptrace guard pinned: none is in place until a \
                 clean restart (SIGTERM, then start)"
            );
        }
        tracing::info!(?guard, "{}", guard.describe());
        let mut tracker = Self {
            view: TrackerView::new(
                members,
                pins.open_map(map::TREE_COUNTERS)?,
                control,
                pins.open_map(map::STATS)?,
                capacity,
            )?,
            events: RingBuf::try_from(events)?,
            account_joined: HashMap::try_from(pins.open_map(map::ACCOUNT_JOINED)?)?,
            account_seeded: HashMap::try_from(pins.open_map(map::ACCOUNT_SEEDED)?)?,
            next_tree: 1,
            whois: Whois::new(
                link_fd(&pins.open_link(program::WHOIS)?)?,
                pins.open_map(map::WHOIS)?,
            )?
            .into(),
            pins: Some(pins),
            guard,
            _guard_links: Vec::new(),
            _programs: None,
        };
        tracker.next_tree = tracker.trees().last().map_or(1, |&last| last + 1);
        tracing::info!(
            trees = tracker.trees().len(),
            ?capacity,
            "took over the pinned programs and maps"
        );
        Ok(tracker)
    }

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

    /// Takes every event waiting in the ring buffer. Best effort: see `Stats::events_dropped`.
    pub fn drain_events(&mut self) -> Vec<TreeEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            events.extend(TreeEvent::decode(&item));
        }
        events
    }

    /// A descriptor that polls readable when events are waiting (a duplicate of the ring
    /// buffer's, so it can be watched without holding the tracker).
    pub fn events_fd(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.events.as_fd().try_clone_to_owned()
    }

    /// Marks `tree` doomed: from now on any member that forks is killed in the kernel, and its
    /// child is killed as soon as user space sees it. Returns when it was first doomed
    /// (boot-time ns): members that started after that were born into a doomed tree.
    pub fn doom(&mut self, tree: TreeId) -> Result<u64> {
        let mut control = self
            .control
            .get(&tree, 0)
            .map_err(|_| anyhow!("no tree {tree}"))?;
        if control.flags & leash_common::flags::DOOMED == 0 {
            control.flags |= leash_common::flags::DOOMED;
            control.doomed_ns = sys::boottime_ns();
            self.view.control.insert(tree, control, 0)?;
        }
        Ok(control.doomed_ns)
    }

    /// Stops tracking `tree`. A tree nested in another hands its members back to it (they
    /// never go free by a release); a tree that stands alone lets them go. Trees nested in
    /// `tree` move up to where it was.
    pub fn release(&mut self, tree: TreeId) -> Result<()> {
        let enclosing = self
            .tree_status(tree)
            .ok()
            .and_then(|status| status.parent)
            .filter(|&parent| self.control.get(&parent, 0).is_ok());
        for nested in self.nested(tree) {
            if let Ok(mut control) = self.control.get(&nested, 0) {
                control.parent = enclosing.unwrap_or(0);
                self.view.control.insert(nested, control, 0)?;
            }
        }
        match enclosing {
            Some(enclosing) => self.hand_back(tree, enclosing)?,
            None => {
                let mut removed = 0;
                for pid in self.member_pids(tree)? {
                    // Already gone: it exited meanwhile (and the program counted it).
                    if self.view.members.remove(&pid).is_ok() {
                        removed += 1;
                    }
                }
                self.add_seeded(tree, -removed)?;
            }
        }
        let account = self.holder(tree).map(|h| h.account).ok();
        let _ = self.view.counters.remove(&tree);
        let _ = self.view.control.remove(&tree);
        // The account's quota entries go with its last tree.
        if let Some(account) = account
            && !self
                .control
                .iter()
                .filter_map(Result::ok)
                .any(|(_, control)| control.holder.account == account)
        {
            let _ = self.account_joined.remove(&account);
            let _ = self.account_seeded.remove(&account);
        }
        tracing::debug!(tree, ?enclosing, "released");
        Ok(())
    }

    /// Moves every member of `tree` into `enclosing`. A member that forks meanwhile may make a
    /// child in `tree` after the walk passed: walk again until none is left.
    fn hand_back(&mut self, tree: TreeId, enclosing: TreeId) -> Result<()> {
        for _ in 0..64 {
            let members: Vec<(Pid, Member)> = self
                .member_entries()?
                .into_iter()
                .filter(|(_, m)| m.tree == tree)
                .collect();
            if members.is_empty() {
                return Ok(());
            }
            for (pid, member) in members {
                let back = Member {
                    tree: enclosing,
                    ..member
                };
                // Only an entry still there: one gone with its process stays gone.
                if self.view.members.insert(pid, back, BPF_EXIST).is_ok() {
                    self.add_seeded(enclosing, 1)?;
                    self.add_seeded(tree, -1)?;
                }
            }
        }
        bail!("the members of tree {tree} kept forking while they were handed back to {enclosing}")
    }

    fn new_tree(
        &mut self,
        root: Pid,
        parent: Option<TreeId>,
        holder: Holder,
    ) -> Result<TreeId, Error> {
        let limit = self.capacity().trees;
        if self.trees().len() as u32 >= limit {
            return Err(Error::TreesFull(limit));
        }
        let tree = self.next_tree;
        self.next_tree = self.next_tree.checked_add(1).context("tree ids ran out")?;
        // Counters first: the programs only ever add to an existing entry.
        let account = holder.account;
        if self.account_joined.get(&account, 0).is_err() {
            self.account_joined.insert(account, 0, BPF_NOEXIST)?;
            self.account_seeded.insert(account, 0, 0)?;
        }
        self.view
            .counters
            .insert(tree, TreeCounters::default(), BPF_NOEXIST)?;
        let control = TreeControl {
            root,
            parent: parent.unwrap_or(0),
            holder,
            ..Default::default()
        };
        self.view.control.insert(tree, control, BPF_NOEXIST)?;
        Ok(tree)
    }

    /// Takes out `pid`'s entry if it is still `stale`, an entry whose process is gone, and
    /// counts it out of its tree. Only user space can have put such an entry in (the programs
    /// remove a member at its exit); while it is there, no fork can insert a new entry for the
    /// same pid, so the check and the removal see the same entry.
    fn drop_stale(&mut self, pid: Pid, stale: Member) -> Result<()> {
        if self.member(pid) != Some(stale) {
            return Ok(());
        }
        if self.view.members.remove(&pid).is_ok() {
            tracing::warn!(
                pid,
                tree = stale.tree,
                "took out a member whose process is gone"
            );
            self.add_seeded(stale.tree, -1)?;
        }
        Ok(())
    }

    /// Counts `count` members put into `tree` by user space (negative: taken out), for the
    /// tree and for its account's quota.
    fn add_seeded(&mut self, tree: TreeId, count: i64) -> Result<()> {
        let mut control = self.control.get(&tree, 0)?;
        control.seeded += count;
        self.view.control.insert(tree, control, 0)?;
        for account in [control.holder.account, ALL_ACCOUNTS] {
            let seeded = self.account_seeded.get(&account, 0).unwrap_or(0);
            self.account_seeded.insert(account, seeded + count, 0)?;
        }
        Ok(())
    }

    /// Whether the trees have every member the capacity allows: user space puts no more in
    /// (the reserve beyond it is the programs', for children forked at the capacity).
    fn at_capacity(&self) -> bool {
        let count = |map: &HashMap<MapData, Account, i64>| map.get(&ALL_ACCOUNTS, 0).unwrap_or(0);
        count(&self.account_joined) + count(&self.account_seeded)
            >= i64::from(self.capacity().members)
    }
}

const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;

/// The ptrace guard attached, and the links of it this process must hold (those not pinned).
type GuardInPlace = (Guard, Vec<ptrace_guard::HeldLink>);

/// The programs, loaded with the kernel's offsets and attached.
struct Attached {
    ebpf: Ebpf,
    links: Vec<(&'static str, aya::programs::tp_btf::BtfTracePointLinkId)>,
    whois: FdLink,
    guard: Guard,
    guard_links: Vec<(&'static str, ptrace_guard::HeldLink)>,
}

impl Attached {
    fn load(capacity: Capacity) -> Result<Self> {
        support::check()?;
        let kernel = btf::kernel()?;
        let task = btf::TaskOffsets::from_btf(&kernel)?;
        let namespaces = btf::namespace_offsets(&kernel)?;
        drop(kernel);
        tracing::debug!(?task, ?capacity, "loading the leash programs");

        // Parsed once, for the loader's relocations and every attachment below.
        let kernel_btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&kernel_btf))
            .override_global(global::TASK_TGID_OFFSET, &task.tgid, true)
            .override_global(global::TASK_START_OFFSET, &task.start_boottime, true)
            .override_global(global::TASK_GROUP_LEADER_OFFSET, &task.group_leader, true)
            .override_global(global::TASK_SIGNAL_OFFSET, &task.signal, true)
            .override_global(global::SIGNAL_LIVE_OFFSET, &task.signal_live, true)
            .override_global(global::NS_PER_TICK, &proc::ticks_to_ns(1), true)
            .override_global(
                global::MEMBERS_PER_UID,
                &capacity.members_per_uid.unwrap_or(NO_LIMIT),
                true,
            )
            .override_global(global::MEMBER_CAPACITY, &capacity.members, true)
            .override_global(global::NAMESPACE_OFFSETS, &namespaces, true)
            .map_max_entries(
                map::MEMBERS,
                capacity.members.saturating_add(MEMBER_RESERVE),
            )
            .map_max_entries(map::TREE_COUNTERS, capacity.trees)
            .map_max_entries(map::TREE_CONTROL, capacity.trees)
            .map_max_entries(map::EVENTS, capacity.event_bytes)
            // One entry per uid that owns a tree (never more than there are trees), and one
            // for all of them.
            .map_max_entries(map::ACCOUNT_JOINED, capacity.trees + 1)
            .map_max_entries(map::ACCOUNT_SEEDED, capacity.trees + 1)
            .load(PROGRAMS)
            .context("loading the leash eBPF object (are you root?)")?;

        let mut links = Vec::new();
        for (name, attach_to) in PROGRAMS_ATTACHED {
            let tracepoint = attach_to
                .strip_prefix("tp_btf/")
                .context("only tp_btf programs are attached")?;
            let program: &mut BtfTracePoint = program_mut(&mut ebpf, name)?.try_into()?;
            program
                .load(tracepoint, &kernel_btf)
                .with_context(|| format!("loading {name} for {tracepoint}"))?;
            let link = program
                .attach()
                .with_context(|| format!("attaching {name} to {tracepoint}"))?;
            links.push((name, link));
        }
        let whois = attach_whois(&mut ebpf, &kernel_btf)?;
        // After the trackers: a guard is worth nothing without the membership it reads.
        let (guard, guard_links) =
            ptrace_guard::attach(&mut ebpf, &kernel_btf, capacity.ptrace_guard);
        Ok(Self {
            ebpf,
            links,
            whois,
            guard,
            guard_links,
        })
    }

    /// Pins the links (taken out of their programs, they then outlive this process) and the
    /// maps; returns the programs, which hold the maps, the whois link, and the guard with the
    /// links of it that the kernel cannot pin.
    fn pin(self, pins: &mut Pins) -> Result<(Ebpf, OwnedFd, GuardInPlace)> {
        let Self {
            mut ebpf,
            links,
            whois,
            guard,
            guard_links,
        } = self;
        for (name, link) in links {
            let program: &mut BtfTracePoint = program_mut(&mut ebpf, name)?.try_into()?;
            pins.pin_link(name, FdLink::from(program.take_link(link)?))?;
        }
        let whois_link = link_fd(&whois)?;
        pins.pin_link(program::WHOIS, whois)?;
        let mut unpinned = Vec::new();
        for (name, link) in guard_links {
            match link {
                ptrace_guard::HeldLink::Raw(fd) => pins.pin_raw_link(name, fd)?,
                ptrace_guard::HeldLink::TracePoint(link)
                    if ptrace_guard::tracepoint_links_pin() =>
                {
                    pins.pin_link(name, FdLink::try_from(link)?)?
                }
                held @ ptrace_guard::HeldLink::TracePoint(_) => {
                    tracing::warn!(
                        program = name,
                        "the fallback ptrace guard cannot be pinned on this kernel (classic \
                         tracepoint links are pinnable from Linux 5.15): it ends with this \
                         daemon, and a daemon that takes over the pins has none"
                    );
                    unpinned.push(held);
                }
            }
        }
        for name in map::ALL {
            let map = ebpf.map(name).context("a map missing from the object")?;
            pins.pin_map(name, map)?;
        }
        Ok((ebpf, whois_link, (guard, unpinned)))
    }
}

/// Loads and attaches the whois iterator.
fn attach_whois(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Result<FdLink> {
    let program: &mut Iter = program_mut(ebpf, program::WHOIS)?.try_into()?;
    program
        .load("task", kernel_btf)
        .context("loading the whois task iterator (task iterators need Linux 5.8)")?;
    let link = program.attach().context("attaching the whois iterator")?;
    Ok(FdLink::try_from(program.take_link(link)?)?)
}

/// A descriptor of `link` of its own (aya's handles lend none), which holds the link whatever
/// becomes of the handle.
fn link_fd(link: &FdLink) -> Result<OwnedFd> {
    let id = link.info()?.id();
    sys::bpf_link_fd_by_id(id).context("opening a BPF link by its id")
}

fn program_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing from the object"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_record_decodes_and_a_short_one_does_not() {
        let event = Event {
            kind: EventKind::RootExit as u32,
            tree: 7,
            pid: 4242,
            parent: 1,
            time_ns: 123_456_789,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
        };
        let mut bytes = Vec::new();
        for word in [event.kind, event.tree, event.pid, event.parent] {
            bytes.extend(word.to_ne_bytes());
        }
        bytes.extend(event.time_ns.to_ne_bytes());
        bytes.extend(event.comm);
        assert_eq!(bytes.len(), size_of::<Event>());
        let decoded = TreeEvent::decode(&bytes).unwrap();
        assert_eq!(decoded.kind, EventKind::RootExit);
        assert_eq!((decoded.tree, decoded.pid, decoded.parent), (7, 4242, 1));
        assert_eq!(decoded.time_ns, 123_456_789);
        assert_eq!(decoded.comm, "python3");
        assert!(TreeEvent::decode(&bytes[..30]).is_none());
        bytes[0] = 99;
        assert!(
            TreeEvent::decode(&bytes).is_none(),
            "an unknown kind is dropped"
        );
    }
}
