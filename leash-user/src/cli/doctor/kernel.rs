//! The kernel's findings: its version, BTF, lockdown, the bpf(2) system call, and what the
//! programs need (kernel/support.rs's probes, every one of them). The probes that load BPF
//! pin nothing, and close what they loaded and attached.

use std::{fs, io};

use leash::kernel::support;

use super::{
    bounds::{BPF_TIMEOUT, NEEDS_ROOT_FIX, TIMEOUT, bounded, timed_out},
    report::{Finding, Status},
};

/// The kernel: its version, BTF, lockdown, the bpf(2) system call, and what the programs need
/// (kernel/support.rs's probes, every one of them).
pub(super) fn kernel_findings(root: bool) -> Vec<Finding> {
    let mut findings = Vec::new();
    let release = support::release();
    findings.push(match support::meets_floor() {
        Some(true) => Finding::ok(
            "kernel",
            format!(
                "Linux {release} ({} or later needed)",
                support::KERNEL_FLOOR
            ),
        ),
        Some(false) => Finding::new(
            "kernel",
            Status::Warn,
            format!(
                "Linux {release} is older than {}: leash runs only if the distribution \
                 backported what the checks below probe",
                support::KERNEL_FLOOR
            ),
        )
        .with_fix(format!(
            "boot a kernel of Linux {} or later (every major distribution's current one)",
            support::KERNEL_FLOOR
        )),
        None => Finding::new(
            "kernel",
            Status::Warn,
            "the kernel's version cannot be read",
        ),
    });

    findings.push(match support::lockdown() {
        Some(mode) if mode == "confidentiality" => Finding::new(
            "lockdown",
            Status::Fail,
            "kernel lockdown is `confidentiality`: it refuses the kernel reads the programs make \
             (bpf_probe_read_kernel)",
        )
        .with_fix(
            "boot with lockdown=integrity (or none) on the kernel command line, e.g. in \
             GRUB_CMDLINE_LINUX; integrity is enough for leash",
        ),
        Some(mode) => Finding::ok(
            "lockdown",
            format!("kernel lockdown is `{mode}`: it allows what the programs do"),
        ),
        None => Finding::ok(
            "lockdown",
            "no lockdown mode to read (no /sys/kernel/security/lockdown): nothing is locked \
             down, or securityfs is not mounted; the probes below tell",
        ),
    });

    let syscall = bounded(TIMEOUT, support::bpf_syscall);
    let bpf_usable = matches!(syscall, Some(Ok(())));
    findings.push(match syscall {
        None => timed_out("bpf_syscall"),
        Some(Ok(())) => Finding::ok("bpf_syscall", "bpf(2) is allowed to this process"),
        Some(Err(e)) if e.raw_os_error() == Some(libc::ENOSYS) => Finding::new(
            "bpf_syscall",
            Status::Fail,
            "this kernel has no bpf(2) system call",
        )
        .with_fix("boot a kernel built with CONFIG_BPF_SYSCALL=y (every major distribution's is)"),
        Some(Err(e)) if is_denied(&e) && !root => Finding::new(
            "bpf_syscall",
            Status::NeedsRoot,
            "needs root to check bpf(2): the daemon runs as root, and bpf(2) is refused to \
             other users",
        )
        .with_fix(NEEDS_ROOT_FIX),
        Some(Err(e)) if is_denied(&e) => Finding::new(
            "bpf_syscall",
            Status::Fail,
            format!(
                "bpf(2) is refused to root here ({e}): this process lacks the capabilities \
                 (effective: {}), as in a container without them",
                effective_capabilities().unwrap_or_else(|| "unknown".into())
            ),
        )
        .with_fix(
            "give the daemon CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and CAP_KILL (docker run \
             --privileged, or --cap-add for each; securityContext.privileged in Kubernetes; \
             CapabilityBoundingSet= in a systemd unit)",
        ),
        Some(Err(e)) => Finding::new("bpf_syscall", Status::Fail, format!("bpf(2) failed: {e}"))
            .with_fix("see the kernel log (dmesg) for why"),
    });

    // Without bpf(2) the probes fail, and what they say is not about the kernel: only BTF,
    // a file, is still told.
    let probes = bounded(BPF_TIMEOUT, support::probes).map(|probes| {
        probes
            .into_iter()
            .map(|mut probe| {
                if !bpf_usable && probe.name != "btf" {
                    probe.present = None;
                }
                probe
            })
            .collect::<Vec<_>>()
    });
    let Some(probes) = probes else {
        findings.push(timed_out("kernel_probes"));
        return findings;
    };
    for probe in probes {
        findings.push(match probe.present {
            Some(false) => {
                Finding::new(probe.name, Status::Fail, format!("missing: {}", probe.what)).with_fix(
                    format!(
                        "boot a kernel of Linux {} or later built with CONFIG_BPF_SYSCALL=y and \
                     CONFIG_DEBUG_INFO_BTF=y (every major distribution's current kernel is)",
                        support::KERNEL_FLOOR
                    ),
                )
            }
            // aya's probe of the program type cannot tell on kernels that refuse tracing
            // programs without a target (EPERM): attaching one to its target does.
            _ if probe.name == "tp_btf" && bpf_usable => tp_btf(probe.what),
            None => not_checked(probe.name, bpf_usable, root),
            Some(true) => Finding::ok(probe.name, short(probe.what)),
        });
    }
    findings
}

/// A probe that needs bpf(2), which this process may not use, or that could not tell.
fn not_checked(name: &'static str, bpf_usable: bool, root: bool) -> Finding {
    if bpf_usable {
        Finding::new(
            name,
            Status::Warn,
            "the probe could not tell (see bpf_syscall)",
        )
    } else if root {
        Finding::new(
            name,
            Status::NeedsRoot,
            "not checked: bpf(2) is refused to this process",
        )
        .with_fix("give this process the capabilities bpf_syscall names, then run it again")
    } else {
        Finding::new(
            name,
            Status::NeedsRoot,
            "needs root to check (it loads a BPF program)",
        )
        .with_fix(NEEDS_ROOT_FIX)
    }
}

/// tp_btf is there: load and attach a program as the fork program is (then close both).
fn tp_btf(what: &'static str) -> Finding {
    match bounded(BPF_TIMEOUT, || {
        support::tp_btf_attach().map_err(|e| format!("{e:#}"))
    }) {
        None => timed_out("tp_btf"),
        Some(Ok(())) => Finding::ok(
            "tp_btf",
            format!(
                "{}; a program attached to sched_process_fork, then detached",
                short(what)
            ),
        ),
        Some(Err(e)) => Finding::new(
            "tp_btf",
            Status::Fail,
            format!("the kernel has tp_btf, but {e}"),
        )
        .with_fix(
            "the kernel refuses the programs' kind: look at dmesg, and at a security module \
                 (SELinux, lockdown) that may refuse BPF",
        ),
    }
}

/// A requirement's description up to its first comma: what it is and the Linux that brought it.
fn short(what: &str) -> String {
    let upto = what.find("), ").map_or(what.len(), |i| i + 1);
    what[..upto].to_owned()
}

fn is_denied(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// CapEff of this process, in hex.
fn effective_capabilities() -> Option<String> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .map(|caps| caps.trim().to_owned())
}

/// The membership guarantee this kernel allows, and the one the daemon (`daemon`, its
/// `status`'s word, if it answered) has in place. Linux 7.0 runs tracing programs preemptibly
/// and skips one on a CPU where a preempted task is inside it: there only marks by the BPF LSM
/// (which needs task storage, 5.11) keep every fork seen.
pub(super) fn membership_finding(daemon: Option<&str>) -> Finding {
    let lsm_list = support::active_lsms();
    let lsm_active = lsm_list.as_deref().map(support::lists_bpf);
    let version = support::version();
    let marks_possible = version.is_some_and(|v| v >= (5, 11)) && lsm_active == Some(true);
    let preemptible = version.is_some_and(|v| v >= (7, 0)) && preempt_rcu() != Some(false);
    match (daemon, marks_possible) {
        (Some("marks"), _) => Finding::ok(
            "membership",
            "exact: the daemon's marks are in place (a BPF LSM program on task_alloc, which the \
             kernel never skips, marks every member's child before it runs)",
        ),
        (Some("layered"), true) if preemptible => Finding::new(
            "membership",
            Status::Warn,
            "the BPF LSM is active, yet the daemon's membership is layered: its marks did not \
             attach",
        )
        .with_fix("see the daemon's log at its start (journalctl -u leash): it says why"),
        (None, true) if preemptible => Finding::ok(
            "membership",
            "exact once the daemon attaches its marks: the BPF LSM is active",
        ),
        (_, _) if preemptible => {
            let list = lsm_list.as_deref().map_or("", str::trim);
            let wanted = if list.is_empty() {
                "lockdown,capability,landlock,yama,apparmor,bpf".to_owned()
            } else {
                format!("{list},bpf")
            };
            Finding::new(
                "membership",
                Status::Warn,
                format!(
                    "layered: Linux {} runs tracing programs preemptibly and can skip the fork \
                     programs, and without the BPF LSM (active LSMs: {}) nothing marks a \
                     member's child: a member that forks while the programs are held on its \
                     CPU can leave a child outside its tree",
                    support::release(),
                    if list.is_empty() { "unknown" } else { list }
                ),
            )
            .with_fix(format!(
                "add bpf to the kernel's lsm= boot parameter: in /etc/default/grub, \
                 GRUB_CMDLINE_LINUX=\"... lsm={wanted}\", then update-grub and reboot"
            ))
        }
        (_, _) => Finding::ok(
            "membership",
            "layered, and whole on this kernel: it runs the fork programs with preemption off, \
             so it never skips them",
        ),
    }
}

/// Whether the running kernel was built with CONFIG_PREEMPT_RCU (which 7.x's preemptible
/// tracepoints need), from its config in /boot; None if that cannot be read.
fn preempt_rcu() -> Option<bool> {
    let config = fs::read_to_string(format!("/boot/config-{}", support::uname_release()?)).ok()?;
    Some(config.lines().any(|line| line == "CONFIG_PREEMPT_RCU=y"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requirement_is_shortened_to_what_and_when() {
        assert_eq!(
            short("BPF ring buffers (Linux 5.8), which carry the events"),
            "BPF ring buffers (Linux 5.8)"
        );
        assert_eq!(short("no comma"), "no comma");
    }
}
