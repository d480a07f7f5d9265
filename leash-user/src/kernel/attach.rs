//! Attaching: the programs loaded with the kernel's offsets and attached where the list of
//! programs says (programs.rs): the tracking layer, the whois iterator, the marks where the
//! kernel takes them, and the ptrace guard; and pinned, to outlive the daemon.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result, bail};
use aya::{Ebpf, EbpfLoader};
use leash_common::{MEMBER_RESERVE, NO_LIMIT, global, map, program};

use super::{
    btf,
    link::{self, Attachment, HeldLink},
    marks::Membership,
    pins::Pins,
    programs::{self, Layer, Program, link_fd},
    ptrace_guard::{self, Guard},
    raw, support,
    types::Capacity,
};
use crate::proc;

/// The programs, loaded with the kernel's offsets and attached.
pub(super) struct Attached {
    ebpf: Ebpf,
    /// Every program attached, with its link.
    attachments: Vec<Attachment>,
    guard: Guard,
    membership: Membership,
}

/// What a tracker is made of, once attached (and pinned, or not).
pub(super) struct Loaded {
    /// The programs, which hold the maps.
    pub(super) ebpf: Ebpf,
    /// The links this process must hold: all of them unpinned; pinned, those the kernel cannot
    /// pin (classic tracepoints before Linux 5.15).
    pub(super) held: Vec<HeldLink>,
    /// The iterators' links and the programs whose skips are counted.
    pub(super) fds: Fds,
    /// The programs attached, for `status` (the whois iterator, no tracker, left out).
    pub(super) programs: Vec<&'static Program>,
    pub(super) guard: Guard,
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
        // Why there are no marks, where there are none: said with the membership below.
        let mut no_marks = None;
        let mut ebpf = if marks_possible() {
            match load(&programs::object_for(true)?.bytes) {
                Ok(ebpf) => ebpf,
                Err(e) => {
                    tracing::debug!(
                        "the programs with marks cannot load ({e:#}); loading those without"
                    );
                    no_marks = Some(format!("the programs with marks cannot load: {e:#}"));
                    load(&programs::object_for(false)?.bytes)?
                }
            }
        } else {
            no_marks = Some("the kernel has no task storage (Linux 5.11)".to_owned());
            load(&programs::object_for(false)?.bytes)?
        };

        let mut attachments = Vec::new();
        for program in programs::of_layer(Layer::Tracking).chain(programs::of_layer(Layer::Whois)) {
            attachments.push(link::attach(&mut ebpf, &kernel_btf, program)?);
        }
        let descent = attach_descent(&mut ebpf, &kernel_btf);
        if !descent.is_empty() && programs::object(&ebpf)?.kernel_kill {
            attachments.extend(attach_kernel_kill(&mut ebpf, &kernel_btf));
        }
        attachments.extend(descent);
        let marks = attach_marks(&mut ebpf, &kernel_btf).unwrap_or_else(|why| {
            no_marks.get_or_insert(why);
            Vec::new()
        });
        let membership = if marks.is_empty() {
            // The best the kernel allows without the marks: a third fork program.
            let fork_kprobe = attach_fork_kprobe(&mut ebpf, &kernel_btf);
            log_membership(
                Membership::Layered,
                Some(!fork_kprobe.is_empty()),
                no_marks.as_deref().unwrap_or("the object has none"),
            );
            attachments.extend(fork_kprobe);
            Membership::Layered
        } else {
            log_membership(Membership::Marks, None, "");
            Membership::Marks
        };
        attachments.extend(marks);
        // After the trackers: a guard is worth nothing without the membership it reads.
        let (guard, guard_links) =
            ptrace_guard::attach(&mut ebpf, &kernel_btf, capacity.ptrace_guard);
        attachments.extend(guard_links);
        Ok(Self {
            ebpf,
            attachments,
            guard,
            membership,
        })
    }

    /// Every link held by this process, for as long as it lives: nothing pinned.
    pub(super) fn hold(self) -> Result<Loaded> {
        let fds = self.fds_and_ids()?;
        let programs = self.listed();
        Ok(Loaded {
            ebpf: self.ebpf,
            held: self.attachments.into_iter().map(|a| a.link).collect(),
            fds,
            programs,
            guard: self.guard,
        })
    }

    /// Pins the links (they then outlive this process) and the maps; holds what the kernel
    /// cannot pin.
    pub(super) fn pin(self, pins: &mut Pins) -> Result<Loaded> {
        let fds = self.fds_and_ids()?;
        let programs = self.listed();
        let Self {
            ebpf,
            attachments,
            guard,
            membership,
        } = self;
        let mut held = Vec::new();
        // The marks' links come before their map (see `Pins::complete`).
        for Attachment { program, link, .. } in attachments {
            held.extend(pins.pin_held(program.name, link)?);
        }
        let marks_map = (membership == Membership::Marks).then_some(map::MARKS);
        let descent_map = fds.descent.is_some().then_some(map::DESCENTS);
        for name in map::ALL.into_iter().chain(marks_map).chain(descent_map) {
            let map = ebpf.map(name).context("a map missing from the object")?;
            pins.pin_map(name, map)?;
        }
        Ok(Loaded {
            ebpf,
            held,
            fds,
            programs,
            guard,
        })
    }

    /// The programs attached, as `status` lists them.
    fn listed(&self) -> Vec<&'static Program> {
        listed(self.attachments.iter().map(|a| a.program))
    }

    /// Descriptors of the iterators' links, and the ids of the programs whose skips are
    /// counted (the tracking layer's and the guard's).
    fn fds_and_ids(&self) -> Result<Fds> {
        let link_of = |name: &str| -> Result<OwnedFd> {
            match self.attachments.iter().find(|a| a.program.name == name) {
                Some(Attachment {
                    link: HeldLink::Fd(link),
                    ..
                }) => link_fd(link),
                _ => bail!("no link of {name}"),
            }
        };
        let whois = link_of(program::WHOIS)?;
        let reconcile = match self.membership {
            Membership::Marks => Some(link_of(program::RECONCILE)?),
            Membership::Layered => None,
        };
        let optional = |name: &str| {
            self.attachments
                .iter()
                .any(|a| a.program.name == name)
                .then(|| link_of(name))
                .transpose()
        };
        let descent = optional(program::DESCEND)?;
        let kill = optional(program::KILL)?;
        let counted = self
            .attachments
            .iter()
            .filter(|a| counts_skips(a.program.layer))
            .map(|a| (a.program.name, a.id))
            .collect();
        Ok(Fds {
            whois,
            reconcile,
            descent,
            kill,
            counted,
        })
    }
}

/// What [`Attached::fds_and_ids`] gives: descriptors of the whois, reconciling, descent and
/// kernel kill iterators' links, to make iterators of, and each attached program's name and
/// id, of the layers whose skips are counted.
pub(super) struct Fds {
    pub(super) whois: OwnedFd,
    pub(super) reconcile: Option<OwnedFd>,
    pub(super) descent: Option<OwnedFd>,
    pub(super) kill: Option<OwnedFd>,
    pub(super) counted: Vec<(&'static str, u32)>,
}

/// The programs of `attached` that `status` lists: all but the whois and descent iterators,
/// which follow nothing themselves.
pub(super) fn listed(
    attached: impl IntoIterator<Item = &'static Program>,
) -> Vec<&'static Program> {
    attached
        .into_iter()
        .filter(|program| {
            !matches!(
                program.layer,
                Layer::Whois | Layer::Descent | Layer::KernelKill
            )
        })
        .collect()
}

/// Whether the skips of a layer's programs are counted (`leash_program_skips_total`): the
/// tracking layer's and the guard's. The kernel never skips an LSM program or an iterator.
pub(super) fn counts_skips(layer: Layer) -> bool {
    !matches!(
        layer,
        Layer::Whois | Layer::Descent | Layer::KernelKill | Layer::Marks
    )
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
        .override_global(global::TASK_REAL_PARENT_OFFSET, &task.real_parent, true)
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

/// Attaches the descent iterator (see `kernel::descent`). Never fails: without it, adoptions
/// walk /proc, and a layered membership reconciles nothing.
fn attach_descent(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Vec<Attachment> {
    attach_layer_or_warn(ebpf, kernel_btf, Layer::Descent, |e| {
        tracing::warn!("the descent iterator cannot attach ({e:#}): adoptions walk /proc instead");
    })
}

/// Attaches the kernel kill (see leash-ebpf's kill.rs), where the kernel has its kfunc. Never
/// fails: without it, kills signal member by member through pidfds.
fn attach_kernel_kill(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Vec<Attachment> {
    attach_layer_or_warn(ebpf, kernel_btf, Layer::KernelKill, |e| {
        tracing::warn!("the kernel kill cannot attach ({e:#}): kills signal through pidfds");
    })
}

/// Attaches every program of `layer`, or none, telling `failed` why.
fn attach_layer_or_warn(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    layer: Layer,
    failed: impl FnOnce(anyhow::Error),
) -> Vec<Attachment> {
    let attached: Result<Vec<Attachment>> = programs::of_layer(layer)
        .map(|program| link::attach(ebpf, kernel_btf, program))
        .collect();
    attached.unwrap_or_else(|e| {
        failed(e);
        Vec::new()
    })
}

/// Says once which membership guarantee is in place: for layered membership, the fork
/// programs attached (`fork_kprobe`: with the kprobe) and `no_marks`, why there are no marks.
/// Layered membership is a warning where the kernel may skip the fork programs (7.x, or a
/// version that cannot be read); elsewhere it is whole, and news only.
pub(super) fn log_membership(membership: Membership, fork_kprobe: Option<bool>, no_marks: &str) {
    let name = membership.as_str();
    if membership == Membership::Marks {
        tracing::info!(membership = name, "{}", membership.describe());
        return;
    }
    let programs = match fork_kprobe {
        Some(true) => "a tracepoint program attached twice, and a kprobe",
        Some(false) => "a tracepoint program attached twice; the fork kprobe did not attach",
        None => "a tracepoint program attached twice, and a kprobe where it attached",
    };
    if support::version().is_none_or(|version| version >= (7, 0)) {
        tracing::warn!(
            membership = name,
            "membership: layered. The fork programs ({programs}) follow forks, and this \
             kernel runs them preemptibly: it can skip them, and a member's child goes unseen \
             when all miss its fork. Exact membership needs the marks, and there are none: \
             {no_marks} (leash doctor says what to do)"
        );
    } else {
        tracing::info!(
            membership = name,
            "membership: layered, and whole on this kernel, which never skips the fork \
             programs ({programs}); no marks: {no_marks}"
        );
    }
}

/// Attaches the fork kprobe (see `program::FORK_KPROBE`). Never fails: the fork programs go
/// on without it; the membership line says so, and the debug log why.
fn attach_fork_kprobe(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Vec<Attachment> {
    let attached: Result<Vec<Attachment>> = programs::of_layer(Layer::ForkKprobe)
        .map(|program| link::attach(ebpf, kernel_btf, program))
        .collect();
    attached.unwrap_or_else(|e| {
        tracing::debug!("the fork kprobe cannot attach: {e:#}");
        Vec::new()
    })
}

/// Attaches the marks, where the object has them and the BPF LSM is active: the `task_alloc`
/// LSM program and the reconciling iterator, both or neither (marks the kill cannot find are
/// no guarantee). Never fails the daemon: it runs with the fork programs alone rather than not
/// at all, and the membership line says why (here the reason; the details at debug).
fn attach_marks(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
) -> std::result::Result<Vec<Attachment>, String> {
    if ebpf.map(map::MARKS).is_none() {
        return Ok(Vec::new());
    }
    match raw::bpf_lsm_active() {
        Ok(true) => {}
        Ok(false) => {
            return Err(format!(
                "the BPF LSM is not active, no bpf in {}",
                support::LSM_LIST
            ));
        }
        Err(e) => {
            tracing::debug!("cannot tell whether the BPF LSM is active: {e:#}");
            return Err(format!("cannot tell whether the BPF LSM is active: {e:#}"));
        }
    }
    let attached: Result<Vec<Attachment>> = programs::of_layer(Layer::Marks)
        .map(|program| link::attach(ebpf, kernel_btf, program))
        .collect();
    attached.map_err(|e| {
        tracing::debug!("the marks cannot attach: {e:#}");
        format!("{e:#}")
    })
}
