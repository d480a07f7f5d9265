//! The architectures the guests run: this machine's (x86_64), whose programs the guests share,
//! and arm64, emulated, with binaries cross-built here and programs from Debian's arm64
//! packages.

use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Arch {
    #[default]
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    #[value(name = "arm64", alias = "aarch64")]
    Arm64,
}

impl Arch {
    /// Debian's name of it: the kernels' flavour (cloud-amd64) and apt's architecture.
    pub(crate) fn debian(self) -> &'static str {
        match self {
            Self::X86_64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }

    /// The Rust target the guests' binaries are built for, when it is not this machine's.
    pub(crate) fn cross_target(self) -> Option<&'static str> {
        match self {
            Self::X86_64 => None,
            Self::Arm64 => Some("aarch64-unknown-linux-gnu"),
        }
    }

    /// The QEMU that boots its guests.
    pub(crate) fn qemu(self) -> &'static str {
        match self {
            Self::X86_64 => "qemu-system-x86_64",
            Self::Arm64 => "qemu-system-aarch64",
        }
    }

    /// The serial console its kernels write to: the PC's UART, or the virt machine's PL011.
    pub(crate) fn console(self) -> &'static str {
        match self {
            Self::X86_64 => "ttyS0",
            Self::Arm64 => "ttyAMA0",
        }
    }

    /// The directory of its libraries in a Debian system (multiarch).
    pub(crate) fn multiarch(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64-linux-gnu",
            Self::Arm64 => "aarch64-linux-gnu",
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Self::X86_64 => "x86_64",
            Self::Arm64 => "arm64",
        })
    }
}
