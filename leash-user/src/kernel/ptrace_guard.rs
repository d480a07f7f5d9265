//! The ptrace guard: the programs that refuse a member attach-mode access (ptrace attach,
//! `pidfd_getfd`, `process_vm_writev`, /proc/PID/mem) to processes outside its tree, even of its
//! own uid (leash-ebpf's ptrace.rs). Which one this kernel takes, and attaching it.
//!
//! - A BPF LSM program on the `ptrace_access_check` hook, where the BPF LSM is active (`bpf` in
//!   /sys/kernel/security/lsm: Debian's kernels from 6.1 have it in CONFIG_LSM) and the kernel
//!   has BPF trampolines: the access fails with EPERM. The kernel never skips an LSM program.
//! - Else fmod_ret on `security_ptrace_access_check` (Linux 5.7, with BPF trampolines: x86_64
//!   since 5.5, arm64 since 6.4 with ftrace's direct calls, and CONFIG_SECURITY): the same
//!   refusal, but a kernel that runs tracing programs preemptibly skips it on a CPU where a
//!   preempted task is inside it (see `program::PTRACE_GUARD_LSM`).
//!
//!   aya 0.14 can load neither as it needs, so this module relocates the program itself, with
//!   aya-obj, against the maps aya made, and loads and attaches it with raw `bpf()` calls
//!   (sys/bpf.rs).
//! - Where that fails, syscall tracepoints that SIGKILL the member as it asks. They do not see
//!   /proc/PID/mem, and they refuse every `pidfd_getfd` a member makes.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{TracePoint, trace_point::TracePointLink},
};
use leash_common::program;

use super::{
    programs::{self, program_mut},
    raw::{self, bpf_lsm_active},
    support::LSM_LIST,
};
use crate::sys;

/// The kernel function the fmod_ret program modifies the return of.
const TARGET: &str = "security_ptrace_access_check";
/// The BPF LSM's stub of the `ptrace_access_check` hook, which its programs attach to.
const LSM_TARGET: &str = "bpf_lsm_ptrace_access_check";

/// Which guard to attach: the daemon's `--ptrace-guard`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuardChoice {
    /// The LSM program where the BPF LSM is active, else fmod_ret, else the tracepoints.
    #[default]
    Auto,
    /// fmod_ret, even where the LSM program would attach (else the tracepoints).
    FmodRet,
    /// The tracepoints, even where fmod_ret would attach.
    Tracepoints,
    /// None: a member may reach any process its uid may.
    Off,
}

/// The guard in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The access is refused with EPERM, by the BPF LSM.
    Lsm,
    /// The access is refused with EPERM, in the kernel's check.
    FmodRet,
    /// The member is SIGKILLed as it asks (ptrace attach, `pidfd_getfd`, `process_vm_writev`).
    Tracepoints,
    /// No guard.
    Absent,
}

/// The LSM program and where it attaches.
pub const LSM_PROGRAMS: [(&str, &str); 1] =
    [(program::PTRACE_GUARD_LSM, "lsm/ptrace_access_check")];

/// The fmod_ret program and where it attaches.
pub const FMOD_RET_PROGRAMS: [(&str, &str); 1] = [(
    program::PTRACE_GUARD,
    "fmod_ret/security_ptrace_access_check",
)];

/// The fallback's programs and where they attach.
pub const TRACEPOINT_PROGRAMS: [(&str, &str); 3] = [
    (
        program::PTRACE_ATTACH_TP,
        "tracepoint/syscalls/sys_enter_ptrace",
    ),
    (
        program::PIDFD_GETFD_TP,
        "tracepoint/syscalls/sys_enter_pidfd_getfd",
    ),
    (
        program::VM_WRITEV_TP,
        "tracepoint/syscalls/sys_enter_process_vm_writev",
    ),
];

impl Guard {
    /// Its programs and where each attaches.
    pub fn programs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Lsm => &LSM_PROGRAMS,
            Self::FmodRet => &FMOD_RET_PROGRAMS,
            Self::Tracepoints => &TRACEPOINT_PROGRAMS,
            Self::Absent => &[],
        }
    }

    /// The guard whose links are pinned, as `pinned(program)` says of each.
    pub fn pinned(pinned: impl Fn(&str) -> bool) -> Self {
        [Self::Lsm, Self::FmodRet, Self::Tracepoints]
            .into_iter()
            .find(|guard| guard.programs().iter().all(|(name, _)| pinned(name)))
            .unwrap_or(Self::Absent)
    }

    /// Its name, for the log's fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lsm => "lsm",
            Self::FmodRet => "fmod_ret",
            Self::Tracepoints => "tracepoints",
            Self::Absent => "none",
        }
    }

    /// What it refuses, for the log and `leash status`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Lsm => {
                "ptrace guard: a BPF LSM program on ptrace_access_check refuses (EPERM) a \
                 member's attach-mode access to processes outside its tree"
            }
            Self::FmodRet => {
                "ptrace guard: fmod_ret on security_ptrace_access_check refuses (EPERM) a \
                 member's attach-mode access to processes outside its tree (a kernel that runs \
                 tracing programs preemptibly may skip it: see leash_program_skips_total)"
            }
            Self::Tracepoints => {
                "ptrace guard: fallback tracepoints SIGKILL a member that ptrace-attaches to, \
                 or process_vm_writev's into, a process outside its tree, or calls \
                 pidfd_getfd; /proc/PID/mem is not covered"
            }
            Self::Absent => {
                "no ptrace guard: a member may ptrace, pidfd_getfd or write the memory of any \
                 process its uid may, outside its tree too"
            }
        }
    }
}

/// A guard's link, held by this process until it is pinned (or for good, if it cannot be).
pub enum HeldLink {
    /// A BPF link made by raw `bpf()` (the fmod_ret program).
    Raw(OwnedFd),
    /// A tracepoint's link, taken out of its program.
    TracePoint(TracePointLink),
}

/// Attaches the guard `choice` asks for to the programs of `ebpf` (loaded, their maps made):
/// the LSM program, else fmod_ret, else the tracepoints. Never fails: the daemon runs without
/// a guard rather than not at all, and says so.
pub fn attach(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    choice: GuardChoice,
) -> (Guard, Vec<(&'static str, HeldLink)>) {
    if choice == GuardChoice::Off {
        return (Guard::Absent, Vec::new());
    }
    if choice == GuardChoice::Auto {
        match bpf_lsm_active() {
            Ok(true) => match attach_refusal(ebpf, kernel_btf, Refusal::Lsm) {
                Ok(link) => return (Guard::Lsm, vec![(Refusal::Lsm.program(), link)]),
                Err(e) => tracing::warn!(
                    "the LSM ptrace guard cannot attach ({e:#}); trying fmod_ret instead"
                ),
            },
            Ok(false) => tracing::info!(
                "the BPF LSM is not active (no bpf in {LSM_LIST}; the kernel's lsm= or \
                 CONFIG_LSM leaves it out): the ptrace guard is fmod_ret, which a kernel that \
                 runs tracing programs preemptibly may skip"
            ),
            Err(e) => tracing::warn!(
                "cannot tell whether the BPF LSM is active ({e:#}); the ptrace guard is \
                 fmod_ret"
            ),
        }
    }
    if matches!(choice, GuardChoice::Auto | GuardChoice::FmodRet) {
        match attach_refusal(ebpf, kernel_btf, Refusal::FmodRet) {
            Ok(link) => return (Guard::FmodRet, vec![(Refusal::FmodRet.program(), link)]),
            Err(e) => tracing::warn!(
                "the fmod_ret ptrace guard cannot attach ({e:#}); trying the syscall \
                 tracepoints instead"
            ),
        }
    }
    match attach_tracepoints(ebpf) {
        Ok(links) => (Guard::Tracepoints, links),
        Err(e) => {
            tracing::warn!("the fallback ptrace guard cannot attach either: {e:#}");
            (Guard::Absent, Vec::new())
        }
    }
}

/// The two guards that refuse in the kernel's check: one program each, loaded by hand.
#[derive(Clone, Copy)]
enum Refusal {
    Lsm,
    FmodRet,
}

impl Refusal {
    /// Its program's name, in the object and among the pins.
    fn program(self) -> &'static str {
        match self {
            Self::Lsm => program::PTRACE_GUARD_LSM,
            Self::FmodRet => program::PTRACE_GUARD,
        }
    }

    /// The kernel function its program attaches to: the BPF LSM's stub of the hook, or the
    /// security check itself.
    fn target(self) -> &'static str {
        match self {
            Self::Lsm => LSM_TARGET,
            Self::FmodRet => TARGET,
        }
    }
}

/// Loads the program of `refusal` and attaches it (see [`raw::attach_by_btf_id`]).
fn attach_refusal(ebpf: &Ebpf, kernel_btf: &aya::Btf, refusal: Refusal) -> Result<HeldLink> {
    let kind = match refusal {
        Refusal::Lsm => sys::AttachKind::Lsm,
        Refusal::FmodRet => sys::AttachKind::FmodRet,
    };
    let object = programs::object(ebpf);
    raw::attach_by_btf_id(
        ebpf,
        object,
        kernel_btf,
        refusal.program(),
        kind,
        refusal.target(),
    )
    .map(HeldLink::Raw)
}

fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<Vec<(&'static str, HeldLink)>> {
    ensure_tracefs();
    let mut links = Vec::new();
    for (name, at) in TRACEPOINT_PROGRAMS {
        let (category, event) = at
            .strip_prefix("tracepoint/")
            .and_then(|rest| rest.split_once('/'))
            .context("a tracepoint is category/name")?;
        let program: &mut TracePoint = program_mut(ebpf, name)?.try_into()?;
        program
            .load()
            .with_context(|| format!("loading {name} for {at}"))?;
        let id = program
            .attach(category, event)
            .with_context(|| format!("attaching {name} to {at}"))?;
        links.push((name, HeldLink::TracePoint(program.take_link(id)?)));
    }
    Ok(links)
}

/// Whether a classic tracepoint's link is a BPF link, which can be pinned (Linux 5.15); before,
/// aya attaches through a perf event, which lives only as long as its descriptor.
pub fn tracepoint_links_pin() -> bool {
    super::support::version().is_some_and(|version| version >= (5, 15))
}

/// Classic tracepoints are found through tracefs, which some machines do not mount at boot.
fn ensure_tracefs() {
    let tracefs = std::path::Path::new("/sys/kernel/tracing");
    if tracefs.join("events").exists() || !tracefs.exists() {
        return;
    }
    match sys::mount_with(c"tracefs", tracefs, None) {
        Ok(()) => tracing::info!(path = %tracefs.display(), "mounted tracefs"),
        Err(e) => tracing::warn!("cannot mount tracefs at {}: {e}", tracefs.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_guard_is_the_one_whose_links_are_all_there() {
        assert_eq!(Guard::pinned(|_| false), Guard::Absent);
        assert_eq!(
            Guard::pinned(|name| name == program::PTRACE_GUARD),
            Guard::FmodRet
        );
        assert_eq!(
            Guard::pinned(|name| name == program::PTRACE_GUARD_LSM),
            Guard::Lsm
        );
        assert_eq!(
            Guard::pinned(|name| name != program::PTRACE_GUARD && name != program::PTRACE_GUARD_LSM),
            Guard::Tracepoints
        );
        assert_eq!(
            Guard::pinned(|name| name == program::PTRACE_ATTACH_TP),
            Guard::Absent,
            "a fallback with links missing is not in place"
        );
    }

    /// This machine's kernel has the function (CONFIG_SECURITY) in its BTF.
    #[test]
    fn the_target_has_a_btf_id() {
        let kernel_btf = aya::Btf::from_sys_fs().unwrap();
        assert!(raw::function_btf_id(&kernel_btf, TARGET).unwrap() > 0);
    }
}
