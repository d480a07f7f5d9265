//! Attaching: the programs loaded with the kernel's offsets and attached to their tracepoints,
//! the whois iterator and the ptrace guard; and pinned, to outlive the daemon.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{BtfTracePoint, Iter, links::FdLink},
};
use leash_common::{MEMBER_RESERVE, NO_LIMIT, global, map, program};

use super::{
    btf,
    pins::Pins,
    programs::{self, PROGRAMS_ATTACHED, link_fd, program_mut},
    ptrace_guard::{self, Guard},
    raw, support,
    types::Capacity,
};
use crate::{proc, sys};

/// The ptrace guard attached, and the links of it this process must hold (those not pinned).
pub(super) type GuardInPlace = (Guard, Vec<ptrace_guard::HeldLink>);

/// The programs, loaded with the kernel's offsets and attached.
pub(super) struct Attached {
    pub(super) ebpf: Ebpf,
    pub(super) links: Vec<(&'static str, aya::programs::tp_btf::BtfTracePointLinkId)>,
    pub(super) whois: FdLink,
    /// The marks' links, `task_alloc`'s and the reconciling iterator's, where both attached.
    pub(super) marks: Option<MarkLinks>,
    pub(super) guard: Guard,
    pub(super) guard_links: Vec<(&'static str, ptrace_guard::HeldLink)>,
}

impl Attached {
    pub(super) fn load(capacity: Capacity) -> Result<Self> {
        support::check()?;
        let kernel = btf::kernel()?;
        let task = btf::TaskOffsets::from_btf(&kernel)?;
        let namespaces = btf::namespace_offsets(&kernel)?;
        drop(kernel);
        tracing::debug!(
            max_members = capacity.members,
            max_trees = capacity.trees,
            event_bytes = capacity.event_bytes,
            max_members_per_uid = capacity.members_per_uid,
            tgid_offset = task.tgid,
            start_offset = task.start_boottime,
            "loading the leash programs"
        );

        // Parsed once, for the loader's relocations and every attachment below.
        let kernel_btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let load = |object| load_object(object, capacity, &task, &namespaces, &kernel_btf);
        let mut ebpf = if marks_possible() {
            match load(programs::object_for(true)) {
                Ok(ebpf) => ebpf,
                Err(e) => {
                    tracing::warn!(
                        "the programs with marks cannot load ({e:#}); loading those without"
                    );
                    load(programs::object_for(false))?
                }
            }
        } else {
            load(programs::object_for(false))?
        };

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
        let marks = attach_marks(&mut ebpf, &kernel_btf);
        // After the trackers: a guard is worth nothing without the membership it reads.
        let (guard, guard_links) =
            ptrace_guard::attach(&mut ebpf, &kernel_btf, capacity.ptrace_guard);
        Ok(Self {
            ebpf,
            links,
            whois,
            marks,
            guard,
            guard_links,
        })
    }

    /// Pins the links (taken out of their programs, they then outlive this process) and the
    /// maps; returns the programs, which hold the maps, the whois link, and the guard with the
    /// links of it that the kernel cannot pin.
    pub(super) fn pin(
        self,
        pins: &mut Pins,
    ) -> Result<(Ebpf, OwnedFd, Option<OwnedFd>, GuardInPlace)> {
        let Self {
            mut ebpf,
            links,
            whois,
            marks,
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
        // The marks' map and links last: pins that have the map have the links (see
        // `Pins::complete`).
        let reconcile = match marks {
            Some(MarkLinks {
                task_alloc,
                reconcile,
            }) => {
                let reconcile_link = link_fd(&reconcile)?;
                pins.pin_raw_link(program::TASK_ALLOC, task_alloc)?;
                pins.pin_link(program::RECONCILE, reconcile)?;
                Some(reconcile_link)
            }
            None => None,
        };
        let marks_map = reconcile.is_some().then_some(map::MARKS);
        for name in map::ALL.into_iter().chain(marks_map) {
            let map = ebpf.map(name).context("a map missing from the object")?;
            pins.pin_map(name, map)?;
        }
        Ok((ebpf, whois_link, reconcile, (guard, unpinned)))
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

/// The marks' links: `task_alloc`'s (raw, an LSM program) and the reconciling iterator's.
pub(super) struct MarkLinks {
    pub(super) task_alloc: OwnedFd,
    pub(super) reconcile: FdLink,
}

/// Whether the kernel may have the marks: task storage came with Linux 5.11 (tried where the
/// version cannot be read: a refusal falls back to the object without them).
fn marks_possible() -> bool {
    support::version().is_none_or(|version| version >= (5, 11))
}

/// Loads `object` (the maps made, the programs not yet) with the kernel's offsets and the
/// capacity's sizes.
fn load_object(
    object: &[u8],
    capacity: Capacity,
    task: &btf::TaskOffsets,
    namespaces: &leash_common::NamespaceOffsets,
    kernel_btf: &aya::Btf,
) -> Result<Ebpf> {
    EbpfLoader::new()
        .btf(Some(kernel_btf))
        .allow_unsupported_maps()
        .override_global(global::TASK_TGID_OFFSET, &task.tgid, true)
        .override_global(global::TASK_START_OFFSET, &task.start_boottime, true)
        .override_global(global::TASK_GROUP_LEADER_OFFSET, &task.group_leader, true)
        // Only the object with the marks reads it.
        .override_global(global::TASK_REAL_PARENT_OFFSET, &task.real_parent, false)
        .override_global(global::TASK_SIGNAL_OFFSET, &task.signal, true)
        .override_global(global::SIGNAL_LIVE_OFFSET, &task.signal_live, true)
        .override_global(global::SIGNAL_FLAGS_OFFSET, &task.signal_flags, true)
        .override_global(
            global::SIGACTION_HANDLER_OFFSET,
            &task.sigaction_handler,
            true,
        )
        .override_global(global::NS_PER_TICK, &proc::ticks_to_ns(1), true)
        .override_global(
            global::MEMBERS_PER_UID,
            &capacity.members_per_uid.unwrap_or(NO_LIMIT),
            true,
        )
        .override_global(global::MEMBER_CAPACITY, &capacity.members, true)
        .override_global(global::NAMESPACE_OFFSETS, namespaces, true)
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
        // A host is watched while its lease holds trees: never more hosts than trees.
        .map_max_entries(map::HOSTS, capacity.trees)
        .load(object)
        .context("loading the leash eBPF object (are you root?)")
}

/// Attaches the marks, where the object has them and the BPF LSM is active: the `task_alloc`
/// LSM program and the reconciling iterator, both or neither (marks the kill cannot find are
/// no guarantee). Never fails: the daemon runs with the fork programs alone rather than not at
/// all, and says why.
fn attach_marks(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Option<MarkLinks> {
    ebpf.map(map::MARKS)?;
    match raw::bpf_lsm_active() {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(
                "the BPF LSM is not active (no bpf in {}): membership rests on the fork \
                 programs alone, which a kernel that runs them preemptibly (7.x) may skip",
                support::LSM_LIST
            );
            return None;
        }
        Err(e) => {
            tracing::warn!("cannot tell whether the BPF LSM is active ({e:#}): no marks");
            return None;
        }
    }
    let attached = (|| -> Result<MarkLinks> {
        let task_alloc = raw::attach_by_btf_id(
            ebpf,
            programs::object(ebpf),
            kernel_btf,
            program::TASK_ALLOC,
            sys::AttachKind::Lsm,
            "bpf_lsm_task_alloc",
        )?;
        let program: &mut Iter = program_mut(ebpf, program::RECONCILE)?.try_into()?;
        program
            .load("task", kernel_btf)
            .context("loading the reconciling task iterator")?;
        let link = program
            .attach()
            .context("attaching the reconciling iterator")?;
        let reconcile = FdLink::try_from(program.take_link(link)?)?;
        Ok(MarkLinks {
            task_alloc,
            reconcile,
        })
    })();
    match attached {
        Ok(links) => Some(links),
        Err(e) => {
            tracing::warn!(
                "the marks cannot attach ({e:#}): membership rests on the fork programs alone"
            );
            None
        }
    }
}
