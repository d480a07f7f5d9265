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
//!   aya 0.14 can load neither as it needs: the raw loader (raw.rs) relocates the program
//!   against the maps aya made, and loads and attaches it with raw `bpf()` calls.
//!
//!   On a kernel that may skip it (7.x), a kprobe on `cap_ptrace_access_check` stands beside
//!   it. The check calls that hook only where fmod_ret did not refuse, and the kernel skips a
//!   kprobe only while another kprobe or perf program, or a `bpf()` map call, holds the CPU:
//!   where fmod_ret was skipped, the kprobe SIGKILLs the member as it asks.
//! - Where fmod_ret cannot attach (no BPF trampolines), that kprobe alone: the member dies as it
//!   asks, and the access runs on with the kill pending. It sees all that the check sees.
//! - Where that fails too (no kprobes), syscall tracepoints that SIGKILL the member as it asks.
//!   They do not see /proc/PID/mem, they refuse every `pidfd_getfd` a member makes, and they
//!   slow every system call on the machine (an enabled syscall tracepoint sends every task's
//!   calls down the slow path).

use aya::Ebpf;

use super::{
    link::{self, Attachment},
    programs::{self, Layer, Program},
    raw::bpf_lsm_active,
    support::{self, LSM_LIST},
};

/// Which guard to attach: the daemon's `--ptrace-guard`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuardChoice {
    /// The LSM program where the BPF LSM is active, else fmod_ret, else the tracepoints.
    #[default]
    Auto,
    /// fmod_ret, even where the LSM program would attach (else the kprobe, else the
    /// tracepoints).
    FmodRet,
    /// The kprobe, even where fmod_ret would attach (else the tracepoints).
    Kprobe,
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
    /// The member is SIGKILLed in the kernel's check, as it asks.
    Kprobe,
    /// The member is SIGKILLed as it asks (ptrace attach, `pidfd_getfd`, `process_vm_writev`).
    Tracepoints,
    /// No guard.
    Absent,
}

impl Guard {
    /// Its programs, from the list of programs.
    pub fn programs(self) -> impl Iterator<Item = &'static Program> {
        let layer = match self {
            Self::Lsm => Some(Layer::GuardLsm),
            Self::FmodRet => Some(Layer::GuardFmodRet),
            Self::Kprobe => Some(Layer::GuardKprobe),
            Self::Tracepoints => Some(Layer::GuardTracepoints),
            Self::Absent => None,
        };
        layer.into_iter().flat_map(programs::of_layer)
    }

    /// The guard whose links are pinned, as `pinned(program)` says of each.
    pub fn pinned(pinned: impl Fn(&str) -> bool) -> Self {
        [Self::Lsm, Self::FmodRet, Self::Kprobe, Self::Tracepoints]
            .into_iter()
            .find(|guard| guard.programs().all(|program| pinned(program.name)))
            .unwrap_or(Self::Absent)
    }

    /// Its name, for the log's fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lsm => "lsm",
            Self::FmodRet => "fmod_ret",
            Self::Kprobe => "kprobe",
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
                 tracing programs preemptibly may skip it: there a kprobe beside it SIGKILLs \
                 the member; see leash_program_skips_total)"
            }
            Self::Kprobe => {
                "ptrace guard: a kprobe on cap_ptrace_access_check SIGKILLs a member \
                 that asks an attach-mode access to a process outside its tree, before the \
                 call returns (a ptrace attach still stops its target)"
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

/// Attaches the guard `choice` asks for to the programs of `ebpf` (loaded, their maps made):
/// the LSM program, else fmod_ret (with the kprobe beside it on 7.x), else the kprobe, else
/// the tracepoints. Never fails: the daemon runs without a guard rather than not at all, and
/// says so. The log has one line for it: the guard in place, and why the better ones are not
/// (each refusal in full at debug).
pub(super) fn attach(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    choice: GuardChoice,
) -> (Guard, Vec<Attachment>) {
    let mut refused = Unusable::default();
    let (guard, links) = attach_best(ebpf, kernel_btf, choice, &mut refused);
    match guard {
        Guard::Absent if choice == GuardChoice::Off => {
            tracing::info!(
                guard = guard.as_str(),
                "{} (none asked for: --ptrace-guard off)",
                guard.describe()
            );
        }
        Guard::Absent => tracing::warn!(
            guard = guard.as_str(),
            "{}: every guard was refused{}",
            guard.describe(),
            refused.words()
        ),
        _ => tracing::info!(
            guard = guard.as_str(),
            "{}{}",
            guard.describe(),
            refused.words()
        ),
    }
    (guard, links)
}

/// The guards tried before the one in place, and why each is not.
#[derive(Debug, Default)]
struct Unusable(Vec<(Guard, String)>);

impl Unusable {
    fn note(&mut self, guard: Guard, why: String) {
        self.0.push((guard, why));
    }

    /// `; not lsm (why), not fmod_ret (why)`, or nothing where none was refused.
    fn words(&self) -> String {
        self.0
            .iter()
            .map(|(guard, why)| format!("not {} ({why})", guard.as_str()))
            .fold(String::new(), |words, refusal| {
                if words.is_empty() {
                    format!("; {refusal}")
                } else {
                    format!("{words}, {refusal}")
                }
            })
    }
}

/// Why attaching failed, for a line that names the program already: the error's chain
/// without its outermost context (`attaching leash_ptrace_kp to kprobe/cap_ptrace_access_check`).
fn cause(error: &anyhow::Error) -> String {
    let causes: Vec<String> = error.chain().map(ToString::to_string).collect();
    match causes.split_first() {
        Some((only, [])) => only.clone(),
        Some((_, inner)) => inner.join(": "),
        None => String::new(),
    }
}

/// The best guard of those `choice` allows that attaches, noting in `refused` why each one
/// tried before it did not.
fn attach_best(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    choice: GuardChoice,
    refused: &mut Unusable,
) -> (Guard, Vec<Attachment>) {
    if choice == GuardChoice::Off {
        return (Guard::Absent, Vec::new());
    }
    if choice == GuardChoice::Auto {
        match bpf_lsm_active() {
            Ok(true) => {
                if let Some(links) = try_guard(ebpf, kernel_btf, Guard::Lsm, refused) {
                    return (Guard::Lsm, links);
                }
            }
            Ok(false) => refused.note(
                Guard::Lsm,
                format!(
                    "the BPF LSM is not active: no bpf in {LSM_LIST}, which the kernel's lsm= \
                     or CONFIG_LSM leaves out"
                ),
            ),
            Err(e) => refused.note(
                Guard::Lsm,
                format!("cannot tell whether the BPF LSM is active: {e:#}"),
            ),
        }
    }
    if matches!(choice, GuardChoice::Auto | GuardChoice::FmodRet)
        && let Some(mut links) = try_guard(ebpf, kernel_btf, Guard::FmodRet, refused)
    {
        links.extend(beside_fmod_ret(ebpf, kernel_btf));
        return (Guard::FmodRet, links);
    }
    if choice != GuardChoice::Tracepoints
        && let Some(links) = try_guard(ebpf, kernel_btf, Guard::Kprobe, refused)
    {
        return (Guard::Kprobe, links);
    }
    match try_guard(ebpf, kernel_btf, Guard::Tracepoints, refused) {
        Some(links) => (Guard::Tracepoints, links),
        None => (Guard::Absent, Vec::new()),
    }
}

/// Attaches `guard`, or notes in `refused` why it cannot.
fn try_guard(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    guard: Guard,
    refused: &mut Unusable,
) -> Option<Vec<Attachment>> {
    attach_guard(ebpf, kernel_btf, guard)
        .map_err(|e| {
            tracing::debug!(
                guard = guard.as_str(),
                "the {} ptrace guard cannot attach: {e:#}",
                guard.as_str()
            );
            refused.note(guard, cause(&e));
        })
        .ok()
}

/// The kprobe beside fmod_ret, where the kernel may skip fmod_ret: 7.x, and a version that
/// cannot be read. Never fails: fmod_ret goes on alone, and the log says why.
fn beside_fmod_ret(ebpf: &mut Ebpf, kernel_btf: &aya::Btf) -> Vec<Attachment> {
    if support::version().is_some_and(|version| version < (7, 0)) {
        return Vec::new();
    }
    attach_guard(ebpf, kernel_btf, Guard::Kprobe).unwrap_or_else(|e| {
        tracing::warn!(
            "the kprobe beside the fmod_ret ptrace guard cannot attach ({e:#}): where the \
             kernel skips fmod_ret, a member's access goes through"
        );
        Vec::new()
    })
}

/// Attaches every program of `guard`, or none (the links made are dropped on a failure).
fn attach_guard(
    ebpf: &mut Ebpf,
    kernel_btf: &aya::Btf,
    guard: Guard,
) -> anyhow::Result<Vec<Attachment>> {
    guard
        .programs()
        .map(|program| link::attach(ebpf, kernel_btf, program))
        .collect()
}

#[cfg(test)]
mod tests {
    use leash_common::program;

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
            Guard::pinned(|name| name == program::PTRACE_GUARD_KPROBE),
            Guard::Kprobe
        );
        assert_eq!(
            Guard::pinned(
                |name| name == program::PTRACE_GUARD || name == program::PTRACE_GUARD_KPROBE
            ),
            Guard::FmodRet,
            "fmod_ret with the kprobe beside it"
        );
        assert_eq!(
            Guard::pinned(|name| name != program::PTRACE_GUARD
                && name != program::PTRACE_GUARD_LSM
                && name != program::PTRACE_GUARD_KPROBE),
            Guard::Tracepoints
        );
        assert_eq!(
            Guard::pinned(|name| name == program::PTRACE_ATTACH_TP),
            Guard::Absent,
            "a fallback with links missing is not in place"
        );
    }

    #[test]
    fn the_guards_refused_are_said_on_one_line_with_why() {
        let mut refused = Unusable::default();
        assert_eq!(refused.words(), "", "nothing refused, nothing said");
        let error = anyhow::anyhow!("No such file or directory (os error 2)")
            .context("`/sys/bus/event_source/devices/kprobe/type`")
            .context("attaching leash_ptrace_kp to kprobe/cap_ptrace_access_check");
        assert_eq!(
            cause(&error),
            "`/sys/bus/event_source/devices/kprobe/type`: No such file or directory (os error 2)"
        );
        refused.note(Guard::Lsm, "the BPF LSM is not active".into());
        refused.note(Guard::Kprobe, cause(&error));
        assert_eq!(
            refused.words(),
            "; not lsm (the BPF LSM is not active), not kprobe (`/sys/bus/event_source/devices/\
             kprobe/type`: No such file or directory (os error 2))"
        );
    }

    /// This machine's kernel has the function (CONFIG_SECURITY) in its BTF.
    #[test]
    fn the_target_has_a_btf_id() {
        let kernel_btf = aya::Btf::from_sys_fs().unwrap();
        let target = match programs::named(program::PTRACE_GUARD).unwrap().at {
            programs::AttachPoint::FmodRet(function) => function,
            other => panic!("the fmod_ret guard attaches to {other}"),
        };
        assert!(super::super::raw::function_btf_id(&kernel_btf, target).unwrap() > 0);
    }
}
