//! The compiled programs, embedded, and handles into them.

use std::{fmt, os::fd::OwnedFd, sync::OnceLock};

use anyhow::{Context, Result};
use aya::{Ebpf, programs::links::FdLink};
use leash_common::program;

use super::kfunc;
use crate::sys;

/// The compiled programs, embedded at build time by build.rs.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leash-ebpf"));

/// The same programs with the marks' map and programs (leash-ebpf's marks.rs), for kernels
/// with task storage (Linux 5.11): a kernel without refuses the whole object for its one map.
static OBJECT_WITH_MARKS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leash-ebpf-marks"));

/// An object as this kernel loads it: its kfunc calls patched (see kfunc.rs).
#[derive(Debug)]
pub(super) struct Patched {
    pub(super) bytes: Vec<u8>,
    /// Whether the kernel has the kfunc the kernel kill calls: only then is it attached.
    pub(super) kernel_kill: bool,
}

/// The object to load: with the marks where `marks` says the kernel can have them, its kfunc
/// calls patched for this kernel (once, on first use).
pub(super) fn object_for(marks: bool) -> Result<&'static Patched> {
    static PLAIN: OnceLock<Result<Patched, String>> = OnceLock::new();
    static WITH_MARKS: OnceLock<Result<Patched, String>> = OnceLock::new();
    let (cell, object) = if marks {
        (&WITH_MARKS, OBJECT_WITH_MARKS)
    } else {
        (&PLAIN, OBJECT)
    };
    anyhow::ensure!(
        !object.is_empty(),
        "this leash was built with AYA_BUILD_SKIP set (for an editor or clippy), and carries no \
         eBPF programs: build it without that variable (`cargo xtask setup` installs what the \
         eBPF build needs)"
    );
    let patched = cell.get_or_init(|| {
        let kernel_btf = aya::Btf::from_sys_fs().map_err(|e| format!("{e:#}"))?;
        let (bytes, kernel_kill) =
            kfunc::patched(object, &kernel_btf).map_err(|e| format!("{e:#}"))?;
        Ok(Patched { bytes, kernel_kill })
    });
    patched
        .as_ref()
        .map_err(|e| anyhow::anyhow!("patching the programs' kfunc calls: {e}"))
}

/// The object `ebpf` was loaded from (the one with the marks has their map).
pub(super) fn object(ebpf: &Ebpf) -> Result<&'static Patched> {
    object_for(ebpf.map(leash_common::map::MARKS).is_some())
}

/// Where a program attaches, and so which loader and link it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachPoint {
    /// A BTF-typed tracepoint (tp_btf), by its name: aya's `BtfTracePoint`, pinnable from 5.7.
    TpBtf(&'static str),
    /// A BPF LSM hook, by its name (the program attaches to the hook's `bpf_lsm_` stub): the
    /// raw loader (raw.rs), where the BPF LSM is active.
    Lsm(&'static str),
    /// fmod_ret on a kernel function: the raw loader.
    FmodRet(&'static str),
    /// A classic tracepoint, by category and name: aya's `TracePoint`, a pinnable link from
    /// 5.15 (a perf event before).
    TracePoint(&'static str, &'static str),
    /// An iterator over the kernel's objects of a kind (`task`): aya's `Iter`.
    Iter(&'static str),
    /// A kprobe on a kernel function: aya's `KProbe`, a pinnable link from 5.15 (a perf event
    /// before).
    KProbe(&'static str),
}

impl fmt::Display for AttachPoint {
    /// As `leash status` and the docs name it: `tp_btf/sched_process_fork`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TpBtf(name) => write!(f, "tp_btf/{name}"),
            Self::Lsm(hook) => write!(f, "lsm/{hook}"),
            Self::FmodRet(function) => write!(f, "fmod_ret/{function}"),
            Self::TracePoint(category, name) => write!(f, "tracepoint/{category}/{name}"),
            Self::Iter(kind) => write!(f, "iter/{kind}"),
            Self::KProbe(function) => write!(f, "kprobe/{function}"),
        }
    }
}

/// What a program is there for. The tracking layer and whois are always attached; the marks
/// where the BPF LSM is active; one of the ptrace guard's three ways, as the kernel allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layer {
    /// Following forks, exits, execs and hosts' deaths into the maps.
    Tracking,
    /// The fork programs' work a third time, from a kprobe, where the marks are not in place:
    /// a skip condition apart from the tracepoints'. Pinned where the kernel can pin it.
    ForkKprobe,
    /// Answering the daemon's questions about a client.
    Whois,
    /// Finding processes by their ancestry: adoptions, and reconciling where the marks are not
    /// (see `kernel::descent`). Pinned with its map where it attached.
    Descent,
    /// Signalling a tree's members from the kernel (the kfunc `bpf_send_signal_task`, 6.13),
    /// through the descent iterator's requests. Pinned where it attached.
    KernelKill,
    /// Membership the kernel never skips (see `kernel::marks`).
    Marks,
    /// The ptrace guard as an LSM program.
    GuardLsm,
    /// The ptrace guard as fmod_ret.
    GuardFmodRet,
    /// The ptrace guard as a kprobe: beside fmod_ret where the kernel may skip that, or in its
    /// place.
    GuardKprobe,
    /// The ptrace guard's fallback, syscall tracepoints.
    GuardTracepoints,
}

/// One program of the object: its name, where it attaches, and its layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub at: AttachPoint,
    pub layer: Layer,
}

impl Program {
    /// As `leash status` lists it: `leash_fork (tp_btf/sched_process_fork)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.at)
    }
}

const fn listed(name: &'static str, at: AttachPoint, layer: Layer) -> Program {
    Program { name, at, layer }
}

/// Every program, where it attaches and its layer: what attaches, pins, counts skips and
/// lists in `status` reads. The tracking layer in the order it is attached: the fork and exit
/// programs twice (see [`program::FORK_AGAIN`]).
pub const PROGRAMS: [Program; 19] = {
    use AttachPoint::*;
    use Layer::*;
    [
        listed(program::FORK, TpBtf("sched_process_fork"), Tracking),
        listed(program::FORK_AGAIN, TpBtf("sched_process_fork"), Tracking),
        listed(program::EXIT, TpBtf("sched_process_exit"), Tracking),
        listed(program::EXIT_AGAIN, TpBtf("sched_process_exit"), Tracking),
        listed(program::EXEC, TpBtf("sched_process_exec"), Tracking),
        listed(program::HOST_KILL, TpBtf("signal_generate"), Tracking),
        listed(program::HOST_CRASH, TpBtf("signal_deliver"), Tracking),
        listed(program::FORK_KPROBE, KProbe("wake_up_new_task"), ForkKprobe),
        listed(program::WHOIS, Iter("task"), Whois),
        listed(program::DESCEND, Iter("task"), Descent),
        listed(program::KILL, Iter("task"), KernelKill),
        listed(program::TASK_ALLOC, Lsm("task_alloc"), Marks),
        listed(program::RECONCILE, Iter("task"), Marks),
        listed(
            program::PTRACE_GUARD_LSM,
            Lsm("ptrace_access_check"),
            GuardLsm,
        ),
        listed(
            program::PTRACE_GUARD,
            FmodRet("security_ptrace_access_check"),
            GuardFmodRet,
        ),
        listed(
            program::PTRACE_GUARD_KPROBE,
            KProbe("cap_ptrace_access_check"),
            GuardKprobe,
        ),
        listed(
            program::PTRACE_ATTACH_TP,
            TracePoint("syscalls", "sys_enter_ptrace"),
            GuardTracepoints,
        ),
        listed(
            program::PIDFD_GETFD_TP,
            TracePoint("syscalls", "sys_enter_pidfd_getfd"),
            GuardTracepoints,
        ),
        listed(
            program::VM_WRITEV_TP,
            TracePoint("syscalls", "sys_enter_process_vm_writev"),
            GuardTracepoints,
        ),
    ]
};

/// The programs of `layer`, in the list's order.
pub fn of_layer(layer: Layer) -> impl Iterator<Item = &'static Program> {
    PROGRAMS.iter().filter(move |p| p.layer == layer)
}

/// The program named `name` (one of [`program`]'s).
#[cfg(test)]
pub(super) fn named(name: &str) -> Option<&'static Program> {
    PROGRAMS.iter().find(|p| p.name == name)
}

/// A descriptor of `link` of its own (aya's handles lend none), which holds the link whatever
/// becomes of the handle.
pub(super) fn link_fd(link: &FdLink) -> Result<OwnedFd> {
    let id = link.info()?.id();
    sys::bpf_link_fd_by_id(id).context("opening a BPF link by its id")
}

pub(super) fn program_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))
}

pub(super) fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing from the object"))
}

#[cfg(test)]
mod tests {
    use super::{
        super::kfunc::{CALL, PSEUDO_KFUNC_CALL, R0_IS_0, SEND_SIGNAL_TASK, calls_to, patched},
        OBJECT,
    };

    /// The object embedded in this build calls the kfunc, and every call is found.
    #[test]
    fn the_kill_programs_calls_are_found_and_patched() {
        let object = OBJECT;
        let calls = calls_to(object, SEND_SIGNAL_TASK).unwrap();
        assert!(
            !calls.is_empty(),
            "the kernel kill calls {SEND_SIGNAL_TASK}"
        );
        for &at in &calls {
            assert_eq!(object[at], CALL);
        }
        let kernel_btf = aya::Btf::from_sys_fs().unwrap();
        let (patched, found) = patched(object, &kernel_btf).unwrap();
        for &at in &calls {
            let call = &patched[at..at + 8];
            if found {
                assert_eq!(call[1] >> 4, PSEUDO_KFUNC_CALL);
            } else {
                assert_eq!(call, R0_IS_0);
            }
        }
    }
}
