//! Loading: the programs loaded and attached afresh (pinned, or not), or taken over from the
//! pins a previous daemon left.

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, Map, MapData, RingBuf};
use leash_common::{ALL_ACCOUNTS, MEMBER_RESERVE, map, program};

use super::{
    attach::{Attached, Fds, Loaded, listed, log_membership},
    descent::Descent,
    maps::BPF_NOEXIST,
    marks::Marks,
    pin_lock::PinLock,
    pins::Pins,
    programs::{link_fd, take_map},
    ptrace_guard::{Guard, GuardChoice},
    skips::ProgramSkips,
    tracker::Tracker,
    types::{Capacity, Origin},
    view::TrackerView,
    whois::Whois,
};

impl Tracker {
    /// Loads the programs with the kernel's offsets and attaches them. Needs root (or
    /// CAP_BPF + CAP_PERFMON) and a kernel with BTF.
    pub fn load(capacity: Capacity) -> Result<Self> {
        Self::from_programs(Attached::load(capacity)?.hold()?, capacity, None)
    }

    /// Like [`Tracker::load`], with the links and maps pinned under `root`, so tracking goes on
    /// if this process dies. If a previous process left its pins there, takes them over
    /// instead: its programs and maps, with every tree and member they hold (`capacity` is
    /// then theirs).
    ///
    /// Holds `root`'s lock for its life: while another live process holds it, this fails with
    /// a [`PinsHeld`](super::PinsHeld) error before anything is read or removed.
    pub fn load_pinned(capacity: Capacity, root: &Path) -> Result<(Self, Origin)> {
        let (pins, lock) = locked_pins(root)?;
        let (mut tracker, origin) = Self::load_locked(capacity, root, pins, &lock)?;
        tracker.pin_lock = Some(lock);
        Ok((tracker, origin))
    }

    /// [`Tracker::load_pinned`], under the lock.
    fn load_locked(
        capacity: Capacity,
        root: &Path,
        mut pins: Pins,
        lock: &PinLock,
    ) -> Result<(Self, Origin)> {
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
            pins.remove(lock)?;
            pins = Pins::at(root)?;
        }
        let loaded = match Attached::load(capacity)?.pin(&mut pins) {
            Ok(pinned) => pinned,
            Err(e) => {
                // Half-pinned programs would go on running with nobody to read their maps.
                let _ = pins.remove(lock);
                return Err(e);
            }
        };
        tracing::info!(dir = %pins.dir().display(), "programs and maps pinned");
        Ok((
            Self::from_programs(loaded, capacity, Some(pins))?,
            Origin::Loaded,
        ))
    }

    fn from_programs(loaded: Loaded, capacity: Capacity, pins: Option<Pins>) -> Result<Self> {
        let Loaded {
            mut ebpf,
            held,
            fds:
                Fds {
                    whois,
                    reconcile,
                    descent,
                    kill,
                    counted,
                },
            programs,
            guard,
        } = loaded;
        // Which guard and which membership are in place was said as they were attached.
        let whois = Whois::new(whois, take_map(&mut ebpf, map::WHOIS)?)?;
        let descent = match descent {
            Some(link) => {
                Some(Descent::new(link, kill, take_map(&mut ebpf, map::DESCENTS)?)?.into())
            }
            None => None,
        };
        let marks = match reconcile {
            Some(reconcile) => Some(Marks::new(take_map(&mut ebpf, map::MARKS)?, reconcile)?),
            None => None,
        };
        let mut tracker = Self {
            view: TrackerView::new(
                take_map(&mut ebpf, map::MEMBERS)?,
                take_map(&mut ebpf, map::TREE_COUNTERS)?,
                take_map(&mut ebpf, map::TREE_CONTROL)?,
                take_map(&mut ebpf, map::STATS)?,
                capacity,
                ProgramSkips::new(counted)?.into(),
            )?,
            events: RingBuf::try_from(take_map(&mut ebpf, map::EVENTS)?)?,
            account_joined: HashMap::try_from(take_map(&mut ebpf, map::ACCOUNT_JOINED)?)?,
            account_seeded: HashMap::try_from(take_map(&mut ebpf, map::ACCOUNT_SEEDED)?)?,
            hosts: HashMap::try_from(take_map(&mut ebpf, map::HOSTS)?)?,
            next_tree: 1,
            next_generation: 0,
            marks,
            fork_misses_seen: 0,
            pins,
            pin_lock: None,
            whois: whois.into(),
            descent,
            guard,
            programs,
            _links: held,
            _programs: Some(ebpf),
        };
        tracker.log_kill();
        // Every member counts here: the programs only ever add to an existing entry.
        tracker
            .account_joined
            .insert(ALL_ACCOUNTS, 0, BPF_NOEXIST)?;
        tracker
            .account_seeded
            .insert(ALL_ACCOUNTS, 0, BPF_NOEXIST)?;
        Ok(tracker)
    }

    /// Says once at start how kills signal.
    fn log_kill(&self) {
        if self.kernel_kill() {
            tracing::info!(
                kill = "kernel",
                "kills: SIGKILL rounds signal every member from the kernel, in one pass \
                 (bpf_send_signal_task)"
            );
        } else {
            tracing::info!(
                kill = "pidfd",
                "kills: signals go member by member through pidfds (the kernel kill needs \
                 Linux 6.13)"
            );
        }
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
        tracing::info!(guard = guard.as_str(), "{}", guard.describe());
        let marks = if pins.marks() {
            Some(Marks::new(
                pins.open_map(map::MARKS)?,
                link_fd(&pins.open_link(program::RECONCILE)?)?,
            )?)
        } else {
            None
        };
        let descent = if pins.descent() {
            Some(
                Descent::new(
                    link_fd(&pins.open_link(program::DESCEND)?)?,
                    pins.kernel_kill()
                        .then(|| link_fd(&pins.open_link(program::KILL)?))
                        .transpose()?,
                    pins.open_map(map::DESCENTS)?,
                )?
                .into(),
            )
        } else {
            tracing::warn!("the previous daemon pinned no descent iterator: adoptions walk /proc");
            None
        };
        log_membership(
            Marks::membership(marks.as_ref()),
            None,
            "the previous daemon pinned none",
        );
        let mut tracker = Self {
            view: TrackerView::new(
                members,
                pins.open_map(map::TREE_COUNTERS)?,
                control,
                pins.open_map(map::STATS)?,
                capacity,
                ProgramSkips::of_pinned(&pins)?.into(),
            )?,
            events: RingBuf::try_from(events)?,
            account_joined: HashMap::try_from(pins.open_map(map::ACCOUNT_JOINED)?)?,
            account_seeded: HashMap::try_from(pins.open_map(map::ACCOUNT_SEEDED)?)?,
            hosts: HashMap::try_from(pins.open_map(map::HOSTS)?)?,
            next_tree: 1,
            next_generation: 0,
            marks,
            fork_misses_seen: 0,
            whois: Whois::new(
                link_fd(&pins.open_link(program::WHOIS)?)?,
                pins.open_map(map::WHOIS)?,
            )?
            .into(),
            descent,
            programs: listed(pins.pinned_programs()),
            pins: Some(pins),
            pin_lock: None,
            guard,
            _links: Vec::new(),
            _programs: None,
        };
        tracker.log_kill();
        tracker.next_tree = tracker.trees().last().map_or(1, |&last| last + 1);
        // Generations go on from the highest in use, and the clock (see `new_generation`).
        tracker.next_generation = tracker.highest_generation();
        tracing::info!(
            trees = tracker.trees().len(),
            max_members = capacity.members,
            max_trees = capacity.trees,
            event_bytes = capacity.event_bytes,
            "took over the pinned programs and maps"
        );
        Ok(tracker)
    }
}

/// The pins under `root` (made if missing) and their lock.
fn locked_pins(root: &Path) -> Result<(Pins, PinLock)> {
    // A daemon that stops removes the directory as its last act: it may be gone between its
    // making here and the lock, to be made again.
    for _ in 0..3 {
        let pins = Pins::at(root)?;
        if let Some(lock) = PinLock::take(root)? {
            return Ok((pins, lock));
        }
    }
    bail!(
        "{} was removed each time this daemon locked it: is another daemon starting and \
         stopping on it?",
        root.display()
    )
}
