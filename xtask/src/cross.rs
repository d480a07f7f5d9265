//! The machines the release is built for, and what each is called where: Rust's target triple,
//! Debian's architecture, the staging's name. `dist` and `deb` take one with `--target`.
//!
//! The build machine is x86_64 (the only Rust std installed here is x86_64's). An aarch64
//! binary is built with nightly's `-Z build-std`, and run here under qemu-user.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::apt_install;

/// A target architecture of the release.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Arch {
    /// x86_64 (Debian's amd64).
    #[default]
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    /// 64-bit ARM (Debian's arm64).
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
}

/// cargo's arguments that build the standard library for a target that [`Arch::builds_std`]
/// (nightly only; std from rust-src).
pub(crate) const BUILD_STD: [&str; 2] = ["-Z", "build-std=std,panic_abort"];

impl Arch {
    pub(crate) const ALL: [Self; 2] = [Self::X86_64, Self::Aarch64];

    /// The architecture of an ELF binary, from its header's `e_machine`.
    pub(crate) fn of_elf(header: &[u8]) -> Option<Self> {
        let machine = elf_machine(header)?;
        Self::ALL
            .into_iter()
            .find(|arch| arch.elf_machine() == machine)
    }

    /// As Node's `process.arch` and package.json's `cpu` name it.
    pub(crate) fn npm_cpu(self) -> &'static str {
        match self {
            Self::X86_64 => "x64",
            Self::Aarch64 => "arm64",
        }
    }

    /// The platform npm package that carries the binary, as clients/node/src/locate.js
    /// resolves it (`leash-client-linux-${process.arch}`).
    pub(crate) fn npm_package(self) -> String {
        format!("leash-client-linux-{}", self.npm_cpu())
    }

    /// The architecture as Rust and the staging's name call it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64",
            Self::Aarch64 => "aarch64",
        }
    }

    /// Rust's target triple for glibc Linux.
    pub(crate) fn rust_target(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64-unknown-linux-gnu",
            Self::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The GNU triple Debian names the architecture's libraries' directory after (multiarch:
    /// /usr/lib/aarch64-linux-gnu), and its cross tools and their root (/usr/aarch64-linux-gnu).
    pub(crate) fn gnu_triple(self) -> &'static str {
        match self {
            Self::X86_64 => "x86_64-linux-gnu",
            Self::Aarch64 => "aarch64-linux-gnu",
        }
    }

    /// Where Debian's cross C library for the target (libc6-arm64-cross) puts its root:
    /// qemu-user finds a binary's loader and libraries under it, and the cross gcc links
    /// against it.
    fn cross_root(self) -> PathBuf {
        Path::new("/usr").join(self.gnu_triple())
    }

    /// Debian's name of the architecture (a package's `Architecture`).
    pub(crate) fn debian(self) -> &'static str {
        match self {
            Self::X86_64 => "amd64",
            Self::Aarch64 => "arm64",
        }
    }

    /// Whether the toolchain lacks a prebuilt std for the target, so cargo must build it
    /// (nightly's `-Z build-std`, from rust-src): rustup fetches no other target's std here.
    pub(crate) fn builds_std(self) -> bool {
        self != Self::X86_64
    }

    /// `e_machine` of the target's ELF binaries.
    fn elf_machine(self) -> u16 {
        match self {
            Self::X86_64 => 62,
            Self::Aarch64 => 183,
        }
    }

    /// The objdump that reads the target's binaries (binutils' own reads only the host's).
    pub(crate) fn objdump(self) -> &'static str {
        match self {
            Self::X86_64 => "objdump",
            Self::Aarch64 => "aarch64-linux-gnu-objdump",
        }
    }

    /// A command that runs `binary`, built for this target, on this machine: itself, or under
    /// qemu-user with the cross C library as its root.
    pub(crate) fn run(self, binary: &Path) -> Command {
        match self {
            Self::X86_64 => Command::new(binary),
            Self::Aarch64 => {
                let mut command = Command::new("qemu-aarch64-static");
                command.arg("-L").arg(self.cross_root()).arg(binary);
                command
            }
        }
    }

    /// Installs (Debian/Ubuntu, as root) what checking and running the target's binaries here
    /// needs: for aarch64, its objdump, qemu-user and the C library qemu runs them with.
    pub(crate) fn ensure_tools(self) -> Result<()> {
        if self == Self::X86_64 {
            return Ok(());
        }
        let triple = self.gnu_triple();
        let loader = match self {
            Self::X86_64 => "ld-linux-x86-64.so.2",
            Self::Aarch64 => "ld-linux-aarch64.so.1",
        };
        install_missing(&[
            (
                PathBuf::from(format!("/usr/bin/{}", self.objdump())),
                format!("binutils-{triple}"),
            ),
            (
                PathBuf::from(format!("/usr/bin/qemu-{}-static", self.name())),
                "qemu-user-static".to_owned(),
            ),
            (
                self.cross_root().join("lib").join(loader),
                format!("libc6-{}-cross", self.debian()),
            ),
        ])
    }

    /// [`Self::ensure_tools`], and what linking the target's binaries with gcc needs (cargo's
    /// own linking, as the tests' cross build does; `dist` links with zig): Debian's cross
    /// gcc and the target's C library to link against.
    pub(crate) fn ensure_gcc_toolchain(self) -> Result<()> {
        self.ensure_tools()?;
        if self == Self::X86_64 {
            return Ok(());
        }
        install_missing(&[
            (
                PathBuf::from(format!("/usr/bin/{}", self.gcc())),
                format!("gcc-{}", self.gnu_triple()),
            ),
            (
                self.cross_root().join("lib/libc.so"),
                format!("libc6-dev-{}-cross", self.debian()),
            ),
        ])
    }

    /// The gcc that links the target's binaries.
    pub(crate) fn gcc(self) -> String {
        match self {
            Self::X86_64 => "cc".to_owned(),
            Self::Aarch64 => format!("{}-gcc", self.gnu_triple()),
        }
    }

    /// The environment variable that tells cargo the target's linker.
    pub(crate) fn cargo_linker_var(self) -> String {
        format!(
            "CARGO_TARGET_{}_LINKER",
            self.rust_target().to_uppercase().replace('-', "_")
        )
    }

    /// Fails unless `binary` is an ELF file for this target.
    pub(crate) fn check_elf(self, binary: &Path) -> Result<()> {
        let mut header = [0u8; 20];
        std::fs::File::open(binary)
            .and_then(|mut file| file.read_exact(&mut header))
            .with_context(|| format!("reading {}", binary.display()))?;
        let machine = elf_machine(&header)
            .with_context(|| format!("{} is not a 64-bit ELF file", binary.display()))?;
        if machine != self.elf_machine() {
            bail!(
                "{} is an ELF file for machine {machine}, not {} ({})",
                binary.display(),
                self.name(),
                self.elf_machine()
            );
        }
        Ok(())
    }

    /// Where cargo puts what it builds for the target in `profile`.
    pub(crate) fn target_dir(self, workspace: &Path, profile: &str) -> PathBuf {
        workspace
            .join("target")
            .join(self.rust_target())
            .join(profile)
    }
}

/// Installs the packages of `wanted` (a file each provides, the package) whose file is missing.
fn install_missing(wanted: &[(PathBuf, String)]) -> Result<()> {
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|(path, _)| !path.exists())
        .map(|(_, package)| package.as_str())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing, false)
}

/// `e_machine` of a 64-bit little-endian ELF header.
fn elf_machine(header: &[u8]) -> Option<u16> {
    let is_elf64_le = header.starts_with(b"\x7fELF\x02\x01");
    let machine = header.get(18..20)?;
    is_elf64_le.then(|| u16::from_le_bytes([machine[0], machine[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_architecture_comes_from_the_elf_header() {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2; // 64-bit
        header[5] = 1; // little-endian
        header[18] = 0x3e;
        assert_eq!(Arch::of_elf(&header), Some(Arch::X86_64));
        header[18] = 0xb7;
        assert_eq!(Arch::of_elf(&header), Some(Arch::Aarch64));
        header[18] = 0x28; // 32-bit arm
        assert_eq!(Arch::of_elf(&header), None);
        assert_eq!(Arch::of_elf(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn the_xtask_binary_is_an_elf_file_of_this_machine() {
        let me = std::env::current_exe().unwrap();
        let arch = if cfg!(target_arch = "aarch64") {
            Arch::Aarch64
        } else {
            Arch::X86_64
        };
        arch.check_elf(&me).unwrap();
        let other = if arch == Arch::X86_64 {
            Arch::Aarch64
        } else {
            Arch::X86_64
        };
        assert!(other.check_elf(&me).is_err());
        assert_eq!(elf_machine(b"#!/bin/sh\n"), None);
    }

    #[test]
    fn each_target_has_its_names() {
        use clap::ValueEnum;
        assert_eq!(Arch::from_str("arm64", false), Ok(Arch::Aarch64));
        assert_eq!(Arch::from_str("aarch64", false), Ok(Arch::Aarch64));
        assert_eq!(Arch::from_str("x86_64", false), Ok(Arch::X86_64));
        assert_eq!(Arch::from_str("amd64", false), Ok(Arch::X86_64));
        assert_eq!(Arch::default(), Arch::X86_64);
        assert_eq!(Arch::Aarch64.debian(), "arm64");
        assert_eq!(Arch::Aarch64.rust_target(), "aarch64-unknown-linux-gnu");
        assert_eq!(
            Arch::Aarch64.cargo_linker_var(),
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
        );
        assert_eq!(Arch::Aarch64.gcc(), "aarch64-linux-gnu-gcc");
        assert_eq!(
            Arch::Aarch64.cross_root(),
            Path::new("/usr/aarch64-linux-gnu")
        );
    }
}
