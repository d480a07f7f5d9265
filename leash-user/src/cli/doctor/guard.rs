//! The ptrace guard the daemon has in place, from the programs its `status` lists: what it
//! covers, and a warning where /proc/PID/mem, or anything, is left open.

use leash::kernel::Guard;

use super::report::{Finding, Status};

const NAME: &str = "ptrace_guard";

/// The guard whose programs are all among `programs`, `status`'s `name (attach point)` list.
pub(in crate::cli) fn guard_of(programs: &[String]) -> Guard {
    let listed = |name: &str| {
        programs
            .iter()
            .any(|program| program.split(' ').next() == Some(name))
    };
    Guard::pinned(listed)
}

/// The guard of the daemon that listed `programs` (None: it did not answer).
pub(super) fn ptrace_guard_finding(programs: Option<&[String]>) -> Finding {
    let Some(programs) = programs else {
        return Finding::new(
            NAME,
            Status::Warn,
            "not known: the daemon did not answer (its status lists the guard's programs)",
        );
    };
    let guard = guard_of(programs);
    let described = guard
        .describe()
        .strip_prefix("ptrace guard: ")
        .unwrap_or(guard.describe());
    match guard {
        Guard::Lsm | Guard::FmodRet | Guard::Kprobe => {
            Finding::ok(NAME, format!("{}: {described}", guard.as_str()))
        }
        Guard::Tracepoints => Finding::new(
            NAME,
            Status::Warn,
            "the fallback, syscall tracepoints: /proc/PID/mem is not covered (a member may \
             write the memory of its uid's processes outside its tree there), every \
             pidfd_getfd a member makes is refused, and every system call on the machine is \
             slowed",
        )
        .with_fix(
            "a better guard needs the BPF LSM (bpf in the kernel's lsm=), BPF trampolines \
             (fmod_ret) or kprobes (CONFIG_KPROBES=y); the daemon's log at its start says why \
             each was refused (journalctl -u leash)",
        ),
        Guard::Absent => Finding::new(NAME, Status::Warn, described).with_fix(
            "unless the daemon runs with --ptrace-guard off on purpose, its log at its start \
             says why no guard attached (journalctl -u leash)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use leash_common::program;

    use super::*;

    fn listed(names: &[&str]) -> Vec<String> {
        names
            .iter()
            .map(|name| format!("{name} (somewhere/else)"))
            .collect()
    }

    #[test]
    fn the_guard_is_read_from_the_listed_programs() {
        let fallback = listed(&[
            program::FORK,
            program::PTRACE_ATTACH_TP,
            program::PIDFD_GETFD_TP,
            program::VM_WRITEV_TP,
        ]);
        assert_eq!(guard_of(&fallback), Guard::Tracepoints);
        assert_eq!(
            guard_of(&listed(&[program::FORK, program::PTRACE_GUARD_LSM])),
            Guard::Lsm
        );
        assert_eq!(guard_of(&listed(&[program::FORK])), Guard::Absent);
        // A name that only starts like a guard's is not it.
        assert_eq!(
            guard_of(&[format!(
                "{}x (lsm/ptrace_access_check)",
                program::PTRACE_GUARD_LSM
            )]),
            Guard::Absent
        );
    }

    #[test]
    fn only_a_guard_that_leaves_proc_mem_open_or_none_warns() {
        let tracepoints = ptrace_guard_finding(Some(&listed(&[
            program::PTRACE_ATTACH_TP,
            program::PIDFD_GETFD_TP,
            program::VM_WRITEV_TP,
        ])));
        assert_eq!(tracepoints.status, Status::Warn);
        assert!(tracepoints.message.contains("/proc/PID/mem is not covered"));
        assert!(tracepoints.fix.is_some());
        assert_eq!(
            ptrace_guard_finding(Some(&listed(&[program::FORK]))).status,
            Status::Warn
        );
        let lsm = ptrace_guard_finding(Some(&listed(&[program::PTRACE_GUARD_LSM])));
        assert_eq!(lsm.status, Status::Ok);
        assert!(
            lsm.message.starts_with("lsm: a BPF LSM program"),
            "{}",
            lsm.message
        );
        assert_eq!(ptrace_guard_finding(None).status, Status::Warn);
    }
}
