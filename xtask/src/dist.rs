//! `cargo xtask dist`: the `leash` binary that ships, linked by zig against glibc 2.31, checked,
//! and staged with the unit, man pages, completions and docs in
//! target/dist/leash-VERSION-ARCH-linux/ (x86_64, or aarch64 with `--target`). `--check` then
//! runs the x86_64 one in Debian userlands (userland.rs); `cargo xtask deb` packages the
//! staging (deb.rs).

pub(crate) mod deb;
pub(crate) mod userland_check;

use std::{
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cross::Arch, output, setup, status, workspace_root};

/// The oldest glibc the shipped binary runs on: Debian 11's and Ubuntu 20.04's. zig links the
/// binary against it, and the package depends on it: `libc6 (>= 2.31)` in leash-user/Cargo.toml,
/// which cargo-deb cannot be given from here (a test checks they agree, and README's figure).
pub(crate) const GLIBC_FLOOR: (u32, u32) = (2, 31);
/// Pinned, so that a fresh machine links the binary as this one did. PyPI's `cargo-zigbuild`,
/// the binary prebuilt (crates.io has only its source, minutes to build).
const CARGO_ZIGBUILD_VERSION: &str = "0.24.1";
/// PyPI's `ziglang`: zig as a Python package, run as `python -m ziglang`.
const ZIGLANG_VERSION: &str = "0.15.2";
/// What the release build takes on the first run (the dependencies and the eBPF programs
/// compiled from nothing, on 2 cores), said before it starts; later runs take seconds.
const FIRST_BUILD_MINUTES: u32 = 6;

#[derive(clap::Args)]
pub(crate) struct Options {
    /// The machine to build for: x86_64 (amd64) or aarch64 (arm64). aarch64 is built with
    /// nightly's `-Z build-std` (no aarch64 std for stable here) and run under qemu-user for its
    /// checks; installs what that needs (qemu-user-static, libc6-arm64-cross, the aarch64
    /// binutils) when missing.
    #[arg(long, value_enum, default_value_t, value_name = "ARCH")]
    pub target: Arch,
    /// Then run the staged binary in Debian 11 and 13 userlands (chroots, as root): a daemon, a
    /// `leash run` whose host is SIGKILLed, its tree gone. Userlands are cached in
    /// /var/cache/leash-vmtest/userlands (LEASH_VMTEST_CACHE=DIR to change it). x86_64 only:
    /// the userlands are x86_64 chroots (an arm64 binary runs in an arm64 guest of
    /// `cargo xtask vmtest`).
    #[arg(long)]
    pub check: bool,
}

/// What `dist` staged.
pub(crate) struct Staged {
    pub dir: PathBuf,
    pub version: String,
    pub arch: Arch,
}

impl Staged {
    pub(crate) fn binary(&self) -> PathBuf {
        self.dir.join("bin/leash")
    }

    /// The staging of the workspace's version for `arch`, which must exist.
    pub(crate) fn existing(arch: Arch) -> Result<Self> {
        let version = version()?;
        let staged = Self {
            dir: staging_dir(&version, arch),
            version,
            arch,
        };
        if !staged.binary().exists() {
            let command = match arch {
                Arch::X86_64 => "cargo xtask dist".to_owned(),
                other => format!("cargo xtask dist --target {}", other.name()),
            };
            bail!(
                "{} is missing: run `{command}` first",
                staged.binary().display()
            );
        }
        Ok(staged)
    }
}

pub(crate) fn dist(options: &Options) -> Result<()> {
    refuse_check_of_foreign(options.check, options.target)?;
    let staged = build_and_stage(options.target)?;
    if options.check {
        userland_check::check(&staged, None)?;
    }
    Ok(())
}

/// `--check` runs the binary in x86_64 chroots: it cannot check another architecture's.
fn refuse_check_of_foreign(check: bool, arch: Arch) -> Result<()> {
    if check && arch != Arch::X86_64 {
        bail!(
            "--check runs the binary in x86_64 Debian userlands; an {} binary is checked in a \
             guest of its own: cargo xtask vmtest --arch {}",
            arch.name(),
            arch.debian()
        );
    }
    Ok(())
}

pub(crate) fn build_and_stage(arch: Arch) -> Result<Staged> {
    setup()?;
    arch.ensure_tools()?;
    let zig = ensure_zig()?;
    let root = workspace_root();
    let zig_target = zig_target(arch);
    // x86_64 builds with the stable toolchain that runs this task. Other targets have no std
    // for stable here (rustup fetches none), so they build with nightly, which compiles std
    // from rust-src (`-Z build-std`): the aarch64 release is a nightly build. (The linker then
    // warns that nightly's rustlib/aarch64-unknown-linux-gnu/lib is missing: where a prebuilt
    // std would be; harmless.)
    // cargo-zigbuild runs $CARGO (the stable cargo running this task), else `cargo` from PATH
    // (rustup's, which RUSTUP_TOOLCHAIN steers).
    let mut cargo = Command::new(&zig.cargo_zigbuild);
    cargo.arg("zigbuild");
    if arch.builds_std() {
        cargo
            .args(crate::cross::BUILD_STD)
            .env_remove("CARGO")
            .env("RUSTUP_TOOLCHAIN", "nightly");
    }
    let release = arch.target_dir(&root, "release");
    eprintln!(
        "xtask: building leash for {zig_target} with cargo-zigbuild{} ({})",
        if arch.builds_std() {
            " (nightly, -Z build-std)"
        } else {
            ""
        },
        if release.join("leash").exists() {
            "release; quick when little changed".to_owned()
        } else {
            format!("release, the first time here: about {FIRST_BUILD_MINUTES} min")
        }
    );
    status(
        cargo
            .args([
                "--release",
                "--locked",
                "--package",
                "leash-user",
                "--bin",
                "leash",
                "--target",
                &zig_target,
            ])
            .env("CARGO_ZIGBUILD_PYTHON_PATH", &zig.python)
            .current_dir(&root),
    )?;
    // cargo-zigbuild drops the glibc suffix from the directory.
    let built = release.join("leash");
    arch.check_elf(&built)?;
    // The floor is the glibc the binary is linked against (zig's), which the package depends on
    // and the Debian 11 userland checks; the symbols it uses may all be older, and must not be
    // newer.
    let newest = glibc_floor(&built, arch)?;
    if newest > GLIBC_FLOOR {
        bail!(
            "{} needs glibc {}.{}, newer than {}.{}",
            built.display(),
            newest.0,
            newest.1,
            GLIBC_FLOOR.0,
            GLIBC_FLOOR.1
        );
    }
    let staged = stage(&built, arch)?;
    let size = fs::metadata(staged.binary())?.len();
    smoke_test(&staged.binary(), arch)?;
    let (major, minor) = GLIBC_FLOOR;
    println!(
        "dist: {} ({:.1} MiB; glibc {major}.{minor} or later: linked against {major}.{minor}, its \
         newest symbol version GLIBC_{}.{}; libraries: {})",
        staged.binary().display(),
        size as f64 / (1024.0 * 1024.0),
        newest.0,
        newest.1,
        needed_libraries(&staged.binary(), arch)?.join(", ")
    );
    println!("dist: staged in {}", staged.dir.display());
    Ok(staged)
}

/// The workspace's version (leash-user's).
pub(crate) fn version() -> Result<String> {
    let manifest = fs::read_to_string(workspace_root().join("Cargo.toml"))?;
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package && let Some(value) = line.strip_prefix("version") {
            let value = value.trim_start().trim_start_matches('=').trim();
            return Ok(value.trim_matches('"').to_owned());
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

/// Rust's target, with the glibc version cargo-zigbuild links against.
fn zig_target(arch: Arch) -> String {
    format!("{}.{}.{}", arch.rust_target(), GLIBC_FLOOR.0, GLIBC_FLOOR.1)
}

fn staging_dir(version: &str, arch: Arch) -> PathBuf {
    workspace_root().join(format!("target/dist/leash-{version}-{}-linux", arch.name()))
}

/// zig and cargo-zigbuild, both prebuilt from PyPI, in a virtual environment under
/// target/dist.
struct Zig {
    /// The environment's Python, for cargo-zigbuild's `CARGO_ZIGBUILD_PYTHON_PATH` (it runs
    /// `PYTHON -m ziglang`).
    python: PathBuf,
    cargo_zigbuild: PathBuf,
}

fn ensure_zig() -> Result<Zig> {
    let venv = workspace_root().join("target/dist/zig-venv");
    let zig = Zig {
        python: venv.join("bin/python3"),
        cargo_zigbuild: venv.join("bin/cargo-zigbuild"),
    };
    let zig_version = output(Command::new(&zig.python).args(["-m", "ziglang", "version"]));
    let zigbuild_version = output(Command::new(&zig.cargo_zigbuild).arg("--version"));
    if zig_version.is_ok_and(|v| v.trim() == ZIGLANG_VERSION)
        && zigbuild_version
            .is_ok_and(|v| v.split_whitespace().last() == Some(CARGO_ZIGBUILD_VERSION))
    {
        return Ok(zig);
    }
    eprintln!(
        "xtask: installing zig {ZIGLANG_VERSION} and cargo-zigbuild {CARGO_ZIGBUILD_VERSION} \
         (PyPI's, prebuilt: about 60 MB, under a minute) into {}",
        venv.display()
    );
    fs::create_dir_all(venv.parent().context("a directory")?)?;
    if !zig.python.exists() {
        status(Command::new("python3").args(["-m", "venv"]).arg(&venv)).context(
            "making a Python virtual environment (Debian/Ubuntu: apt-get install python3-venv)",
        )?;
    }
    status(Command::new(&zig.python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("ziglang=={ZIGLANG_VERSION}"),
        &format!("cargo-zigbuild=={CARGO_ZIGBUILD_VERSION}"),
    ]))?;
    Ok(zig)
}

/// The newest `GLIBC_x.y` version among the binary's dynamic symbols: the oldest glibc it
/// runs on.
pub(crate) fn glibc_floor(binary: &Path, arch: Arch) -> Result<(u32, u32)> {
    let symbols = output(Command::new(arch.objdump()).arg("-T").arg(binary))
        .context("reading the binary's dynamic symbols (objdump is in binutils)")?;
    newest_glibc(&symbols).with_context(|| format!("{} has no GLIBC_ symbol", binary.display()))
}

fn newest_glibc(objdump: &str) -> Option<(u32, u32)> {
    objdump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.').map(|n| n.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
}

/// The shared libraries the binary links (`NEEDED`).
fn needed_libraries(binary: &Path, arch: Arch) -> Result<Vec<String>> {
    let headers = output(Command::new(arch.objdump()).arg("-p").arg(binary))?;
    Ok(headers
        .lines()
        .filter_map(|line| line.trim().strip_prefix("NEEDED"))
        .map(|library| library.trim().to_owned())
        .collect())
}

/// Stages `binary` with what ships beside it, as a /usr/local-style prefix:
///
/// ```text
/// bin/leash
/// lib/systemd/system/leash.service          ExecStart=/usr/local/bin/leash
/// share/man/man1/leash*.1
/// share/bash-completion/completions/leash
/// share/zsh/vendor-completions/_leash
/// share/fish/vendor_completions.d/leash.fish
/// share/doc/leash/README.md, share/doc/leash/docs/*.md
/// ```
fn stage(binary: &Path, arch: Arch) -> Result<Staged> {
    let root = workspace_root();
    let version = version()?;
    let dir = staging_dir(&version, arch);
    let _ = fs::remove_dir_all(&dir);
    let staged = Staged { dir, version, arch };
    let dir = &staged.dir;

    let bin = staged.binary();
    fs::create_dir_all(bin.parent().context("a directory")?)?;
    fs::copy(binary, &bin).with_context(|| format!("copying to {}", bin.display()))?;

    let unit = dir.join("lib/systemd/system/leash.service");
    fs::create_dir_all(unit.parent().context("a directory")?)?;
    fs::copy(root.join("dist/leash.service"), &unit)?;

    let man = dir.join("share/man/man1");
    fs::create_dir_all(&man)?;
    let man_args = [OsStr::new("manpages"), man.as_os_str()];
    if optional_subcommand(arch, &bin, &man_args, "man pages")?.is_none() {
        fs::remove_dir_all(dir.join("share/man"))?;
    }
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/leash"),
        ("zsh", "share/zsh/vendor-completions/_leash"),
        ("fish", "share/fish/vendor_completions.d/leash.fish"),
    ] {
        let script = optional_subcommand(
            arch,
            &bin,
            &[OsStr::new("completions"), OsStr::new(shell)],
            &format!("{shell} completions"),
        )?;
        if let Some(script) = script {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().context("a directory")?)?;
            fs::write(&path, script)?;
        }
    }

    let doc = dir.join("share/doc/leash");
    fs::create_dir_all(doc.join("docs"))?;
    fs::copy(root.join("README.md"), doc.join("README.md"))?;
    for entry in fs::read_dir(root.join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            fs::copy(
                &path,
                doc.join("docs").join(path.file_name().context("a name")?),
            )?;
        }
    }
    Ok(staged)
}

/// Runs a subcommand of `leash` (built for `arch`) that writes part of the staging; `None`,
/// with a warning, where this build's `leash` does not have it yet.
fn optional_subcommand(
    arch: Arch,
    leash: &Path,
    args: &[&OsStr],
    what: &str,
) -> Result<Option<Vec<u8>>> {
    let mut command = arch.run(leash);
    command.args(args);
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if out.status.success() {
        return Ok(Some(out.stdout));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("unrecognized subcommand") {
        let args: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
        eprintln!(
            "xtask: warning: this leash has no `leash {}`: the staging has no {what}",
            args.join(" ")
        );
        return Ok(None);
    }
    bail!("{command:?} failed: {}", stderr.trim())
}

/// The zig-linked binary starts (under qemu-user for another architecture), parses its
/// arguments and prints its help.
fn smoke_test(binary: &Path, arch: Arch) -> Result<()> {
    let version = output(arch.run(binary).arg("--version"))?;
    let help = output(arch.run(binary).args(["daemon", "--help"]))?;
    if !help.contains("--pin-dir") {
        bail!("`leash daemon --help` does not look right:\n{help}");
    }
    eprintln!("xtask: {} runs: {}", binary.display(), version.trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_glibc_version_is_the_floor() {
        let objdump = "\
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.2.5) free
0000000000000000      DF *UND*	0000000000000000 (GLIBC_2.28) statx
0000000000000000      DF *UND*	0000000000000000  GLIBC_2.3.2 pthread_cond_wait
0000000000000000      DO *UND*	0000000000000000 (GLIBC_PRIVATE) __libc_single_threaded
";
        assert_eq!(newest_glibc(objdump), Some((2, 28)));
        assert_eq!(newest_glibc("nothing"), None);
        assert!(newest_glibc("(GLIBC_2.34) x") > Some(GLIBC_FLOOR));
    }

    #[test]
    fn the_package_and_the_readme_name_the_glibc_floor() {
        let (major, minor) = GLIBC_FLOOR;
        let manifest = fs::read_to_string(workspace_root().join("leash-user/Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("\ndepends = \"libc6 (>= {major}.{minor})\"\n")),
            "leash-user/Cargo.toml's [package.metadata.deb] depends on another glibc than {major}.{minor}"
        );
        let readme = fs::read_to_string(workspace_root().join("README.md")).unwrap();
        assert!(readme.contains(&format!("`libc6 (>= {major}.{minor})`")));
        let glibc_figures: Vec<&str> = readme
            .split("glibc ")
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit() && c != '.').next())
            .filter(|figure| figure.starts_with("2."))
            .collect();
        assert!(!glibc_figures.is_empty());
        for figure in glibc_figures {
            assert_eq!(
                figure.trim_end_matches('.'),
                format!("{major}.{minor}"),
                "README: glibc {figure}"
            );
        }
    }

    #[test]
    fn each_target_has_its_zig_target_and_staging() {
        assert_eq!(zig_target(Arch::X86_64), "x86_64-unknown-linux-gnu.2.31");
        assert_eq!(zig_target(Arch::Aarch64), "aarch64-unknown-linux-gnu.2.31");
        assert!(
            staging_dir("1.2.3", Arch::X86_64).ends_with("target/dist/leash-1.2.3-x86_64-linux")
        );
        assert!(
            staging_dir("1.2.3", Arch::Aarch64).ends_with("target/dist/leash-1.2.3-aarch64-linux")
        );
        assert!(refuse_check_of_foreign(true, Arch::X86_64).is_ok());
        assert!(refuse_check_of_foreign(false, Arch::Aarch64).is_ok());
        assert!(refuse_check_of_foreign(true, Arch::Aarch64).is_err());
    }

    #[test]
    fn the_version_is_the_workspace_s() {
        assert_eq!(version().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
