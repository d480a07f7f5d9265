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
    let missing: Vec<&'static str> = REQUIREMENTS
        .iter()
        .filter(|requirement| (requirement.present)() == Some(false))
        .map(|requirement| requirement.what)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(Unsupported {
        kernel: KernelVersion::current().map_or_else(|_| "unknown".to_owned(), |v| v.to_string()),
        missing,
    })
}

struct Requirement {
    what: &'static str,
    /// Some(present), or None when the probe could not tell.
    present: fn() -> Option<bool>,
}

const REQUIREMENTS: [Requirement; 6] = [
    Requirement {
        what: "BTF, the kernel's type information (/sys/kernel/btf/vmlinux, Linux 5.4), which \
               gives the offsets the programs read at",
        present: || Some(Path::new(VMLINUX_BTF).exists()),
    },
    Requirement {
        what: "BTF-typed tracepoints (tp_btf, Linux 5.5), to which the programs attach",
        present: || is_program_supported(ProgramType::Tracing).ok(),
    },
    Requirement {
        what: "BPF ring buffers (Linux 5.8), which carry the events",
        present: || is_map_supported(MapType::RingBuf).ok(),
    },
    Requirement {
        what: "the helper bpf_ktime_get_boot_ns (Linux 5.8), which times a root's exit",
        present: || helper(BpfHelper::BPF_FUNC_ktime_get_boot_ns),
    },
    Requirement {
        what: "the helper bpf_probe_read_kernel (Linux 5.5), which reads task_struct",
        present: || helper(BpfHelper::BPF_FUNC_probe_read_kernel),
    },
    Requirement {
        what: "the helper bpf_send_signal (Linux 5.3), which stops a fork in a doomed tree",
        present: || helper(BpfHelper::BPF_FUNC_send_signal),
    },
];

/// Whether tracing programs may call `helper` (probed with a tracepoint program: aya cannot
/// probe tp_btf's own type, and the tracing helpers are the same for both).
fn helper(helper: BpfHelper) -> Option<bool> {
    is_helper_supported(ProgramType::TracePoint, helper).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
