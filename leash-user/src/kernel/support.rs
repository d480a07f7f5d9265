//! What the programs need of the running kernel, checked before they load, so that a kernel
//! that lacks something gets an error naming it (and the Linux version that brought it)
//! instead of a verifier log or an errno.
//!
//! The floor is Linux 5.8, the first with all of it; distributions that backport BPF features
//! to older kernels pass the same checks, since they probe the feature, not the version.

use std::{fmt, path::Path};

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
    util::KernelVersion,
};

use super::btf::VMLINUX_BTF;

/// The oldest Linux that has everything leash needs.
pub const KERNEL_FLOOR: &str = "5.8";

/// The kernel lacks something the programs need: every missing piece, each with the Linux
/// version that brought it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The running kernel's release, as uname says it.
    pub kernel: String,
    pub missing: Vec<&'static str>,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "this kernel (Linux {}) cannot run leash: it lacks {}. leash needs Linux \
             {KERNEL_FLOOR} or later built with BPF and BTF (CONFIG_BPF_SYSCALL=y, \
             CONFIG_DEBUG_INFO_BTF=y), as every major distribution's kernel is",
            self.kernel,
            self.missing.join("; ")
        )
    }
}

impl std::error::Error for Unsupported {}

/// Checks that the running kernel has what the programs need. A probe that cannot tell (for
/// want of privileges, say) counts as present: loading the programs then says what is wrong.
pub fn check() -> Result<(), Unsupported> {
    let missing: Vec<&'static str> = probes()
        .into_iter()
        .filter(|probe| probe.present == Some(false))
        .map(|probe| probe.what)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Unsupported {
        kernel: release(),
        missing,
    })
}

/// What one requirement's probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// A short name (`tp_btf`, `ring_buffer`...).
    pub name: &'static str,
    /// What it is, the Linux version that brought it and what leash needs it for.
    pub what: &'static str,
    /// Some(present), or None when the probe could not tell (no privileges for bpf(2)).
    pub present: Option<bool>,
}

/// Every requirement, each probed: all findings, where [`check`] stops at what is missing.
pub fn probes() -> Vec<Probe> {
    REQUIREMENTS
        .iter()
        .map(|requirement| Probe {
            name: requirement.name,
            what: requirement.what,
            present: (requirement.present)(),
        })
        .collect()
}

/// The running kernel's release as uname says it ("unknown" if it cannot be read).
pub fn release() -> String {
    KernelVersion::current().map_or_else(|_| "unknown".to_owned(), |v| v.to_string())
}

/// The running kernel's version as (major, minor), from its release string (aya's reading
/// fails on some, 7.3's release candidates among them); None if it cannot be read.
pub fn version() -> Option<(u32, u32)> {
    parse_version(&uname_release()?)
}

/// `major.minor` from the start of a kernel release string ("7.3.0-rc7-cloud-amd64",
/// "7.3-cloud-amd64", "6.1.0-57-cloud-amd64").
fn parse_version(release: &str) -> Option<(u32, u32)> {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    let major = numbers.next()?.ok()?;
    let minor = numbers.next()?.ok()?;
    Some((major, minor))
}

/// Where securityfs lists the active LSMs.
pub const LSM_LIST: &str = "/sys/kernel/security/lsm";

/// The active LSMs, as securityfs lists them (None if it cannot be read: securityfs not
/// mounted, say).
pub fn active_lsms() -> Option<String> {
    std::fs::read_to_string(LSM_LIST).ok()
}

/// Whether a list of active LSMs has the BPF LSM: only then does the kernel run LSM programs.
pub fn lists_bpf(list: &str) -> bool {
    list.trim().split(',').any(|lsm| lsm == "bpf")
}

/// The running kernel's release string (`uname -r`), as /boot names its files after it.
pub fn uname_release() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    Some(release.trim().to_owned())
}

/// Whether the running kernel is [`KERNEL_FLOOR`] or later (None if its version cannot be
/// read). Only a hint: a distribution kernel may have the features backported, and the probes
/// decide.
pub fn meets_floor() -> Option<bool> {
    let current = KernelVersion::current().ok()?;
    let (major, minor) = KERNEL_FLOOR.split_once('.')?;
    Some(current >= KernelVersion::new(major.parse().ok()?, minor.parse().ok()?, 0))
}

/// Whether this process may use bpf(2): a one-entry array map made and closed. EPERM without
/// CAP_BPF (or CAP_SYS_ADMIN), ENOSYS where the kernel has no BPF system call.
pub fn bpf_syscall() -> std::io::Result<()> {
    crate::sys::bpf_map_create_probe()
}

/// The kernel lockdown mode (`none`, `integrity`, `confidentiality`) from
/// /sys/kernel/security/lockdown; None where there is no lockdown LSM (or no securityfs).
/// `confidentiality` refuses the kernel reads the programs make (bpf_probe_read_kernel);
/// `integrity` refuses only bpf_probe_write_user, which leash does not use.
pub fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_owned())
}

/// Loads a two-instruction tp_btf program on `sched_process_fork` and attaches it (as the
/// fork program is), then closes both: nothing is pinned and nothing stays attached. Needs the
/// privileges the daemon has.
pub fn tp_btf_attach() -> anyhow::Result<()> {
    use std::os::fd::AsFd;

    use anyhow::Context;

    use crate::sys::zeroed_insn;

    const TARGET: &str = "btf_trace_sched_process_fork";
    let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let target = btf
        .id_by_type_name_kind(TARGET, aya_obj::btf::BtfKind::Typedef)
        .with_context(|| format!("finding {TARGET} in the kernel's BTF"))?;
    drop(btf);
    // r0 = 0; exit. Registers 0 and offsets 0: all but the opcode is zero.
    let insns = [zeroed_insn(0xb7), zeroed_insn(0x95)];
    let program = crate::sys::load_by_btf_id(
        crate::sys::AttachKind::TpBtf,
        "leash_probe",
        &insns,
        c"GPL",
        target,
    )
    .context("loading a tp_btf program on sched_process_fork")?;
    let link = crate::sys::attach_tracing(program.as_fd())
        .context("attaching a tp_btf program to sched_process_fork")?;
    drop(link);
    drop(program);
    Ok(())
}

struct Requirement {
    name: &'static str,
    what: &'static str,
    /// Some(present), or None when the probe could not tell.
    present: fn() -> Option<bool>,
}

const REQUIREMENTS: [Requirement; 6] = [
    Requirement {
        name: "btf",
        what: "BTF, the kernel's type information (/sys/kernel/btf/vmlinux, Linux 5.4), which \
               gives the offsets the programs read at",
        present: || Some(Path::new(VMLINUX_BTF).exists()),
    },
    Requirement {
        name: "tp_btf",
        what: "BTF-typed tracepoints (tp_btf, Linux 5.5), to which the programs attach",
        present: tp_btf_present,
    },
    Requirement {
        name: "ring_buffer",
        what: "BPF ring buffers (Linux 5.8), which carry the events",
        present: || is_map_supported(MapType::RingBuf).ok(),
    },
    Requirement {
        name: "helper_ktime_get_boot_ns",
        what: "the helper bpf_ktime_get_boot_ns (Linux 5.8), which times a root's exit",
        present: || helper(BpfHelper::BPF_FUNC_ktime_get_boot_ns),
    },
    Requirement {
        name: "helper_probe_read_kernel",
        what: "the helper bpf_probe_read_kernel (Linux 5.5), which reads task_struct",
        present: || helper(BpfHelper::BPF_FUNC_probe_read_kernel),
    },
    Requirement {
        name: "helper_send_signal",
        what: "the helper bpf_send_signal (Linux 5.3), which stops a fork in a doomed tree",
        present: || helper(BpfHelper::BPF_FUNC_send_signal),
    },
];

/// Whether tp_btf programs load and attach. aya's probe of tracing programs loads an fentry
/// program (on bpf_fentry_test1), which needs more than tp_btf: arm64 kernels before 6.4 (no
/// ftrace direct calls, Debian's 6.1) refuse it, yet run tp_btf. Where aya says no, a tp_btf
/// program is loaded and attached, as the fork program is.
fn tp_btf_present() -> Option<bool> {
    match is_program_supported(ProgramType::Tracing).ok()? {
        true => Some(true),
        false => Some(tp_btf_attach().is_ok()),
    }
}

/// Whether tracing programs may call `helper` (probed with a tracepoint program: aya cannot
/// probe tp_btf's own type, and the tracing helpers are the same for both).
fn helper(helper: BpfHelper) -> Option<bool> {
    is_helper_supported(ProgramType::TracePoint, helper).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_any_release_string() {
        assert_eq!(parse_version("7.3-cloud-amd64"), Some((7, 3)));
        assert_eq!(parse_version("7.3.0-rc7-cloud-amd64"), Some((7, 3)));
        assert_eq!(parse_version("6.1.0-57-cloud-amd64"), Some((6, 1)));
        assert_eq!(parse_version("5.10.0-46-cloud-amd64"), Some((5, 10)));
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn the_error_names_each_missing_piece_and_the_floor() {
        let error = Unsupported {
            kernel: "5.4.0".to_owned(),
            missing: vec![REQUIREMENTS[2].what, REQUIREMENTS[3].what],
        };
        let text = error.to_string();
        assert!(text.contains("Linux 5.4.0"), "{text}");
        assert!(text.contains("BPF ring buffers (Linux 5.8)"), "{text}");
        assert!(text.contains("bpf_ktime_get_boot_ns"), "{text}");
        assert!(text.contains("Linux 5.8 or later"), "{text}");
    }

    /// This machine runs the tests: its kernel has all of it (as root; unprivileged, the
    /// probes cannot tell, which counts as present).
    #[test]
    fn this_kernel_has_everything() {
        assert_eq!(check(), Ok(()));
        assert_eq!(meets_floor(), Some(true));
        assert_eq!(probes().len(), REQUIREMENTS.len());
    }

    /// A tp_btf program attaches to sched_process_fork here, and goes with its descriptors.
    #[test]
    fn a_tp_btf_program_attaches() {
        // Loading a program needs root: the integration tests' opt-out covers this one too.
        if std::env::var("LEASH_TEST_SKIP_BPF").is_ok_and(|v| v == "1") {
            return;
        }
        tp_btf_attach().expect(
            "a tp_btf program loads and attaches (as root; LEASH_TEST_SKIP_BPF=1 skips this)",
        );
    }
}
