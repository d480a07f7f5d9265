//! What booting a guest of an architecture takes: its QEMU and its console. The guests run
//! this machine's architecture (x86_64), whose programs they share, or arm64, emulated, with
//! binaries cross-built here (cross.rs names the targets) and programs from Debian's arm64
//! packages.

pub(crate) use crate::cross::Arch;

/// The guest machine of an architecture.
pub(crate) trait Guest {
    /// The QEMU that boots its guests.
    fn qemu(self) -> &'static str;
    /// The serial console its kernels write to: the PC's UART, or the virt machine's PL011.
    fn console(self) -> &'static str;
}

impl Guest for Arch {
    fn qemu(self) -> &'static str {
        match self {
            Self::X86_64 => "qemu-system-x86_64",
            Self::Aarch64 => "qemu-system-aarch64",
        }
    }

    fn console(self) -> &'static str {
        match self {
            Self::X86_64 => "ttyS0",
            Self::Aarch64 => "ttyAMA0",
        }
    }
}
