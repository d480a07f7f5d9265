//! `cargo xtask dist`: the `leash` binary that ships, linked by zig against glibc 2.31, checked,
//! and staged with the unit, man pages, completions and docs in
//! target/dist/leash-VERSION-x86_64-linux/. `--check` then runs it in Debian userlands
//! (userland.rs); `cargo xtask deb` packages the staging (deb.rs).

pub(crate) mod deb;
pub(crate) mod userland_check;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{output, setup, status, workspace_root};

/// The oldest glibc the shipped binary runs on: Debian 11's and Ubuntu 20.04's.
pub(crate) const GLIBC_FLOOR: (u32, u32) = (2, 31);
/// Rust's target, with the glibc version cargo-zigbuild links against.
const ZIG_TARGET: &str = "x86_64-unknown-linux-gnu.2.31";
/// Where cargo puts what it builds for that target (cargo-zigbuild drops the glibc suffix).
const TARGET_DIR: &str = "target/x86_64-unknown-linux-gnu/release";
/// Pinned, so that a fresh machine links the binary as this one did.
const CARGO_ZIGBUILD_VERSION: &str = "0.24.1";
/// PyPI's `ziglang`: zig as a Python package, run as `python -m ziglang`.
const ZIGLANG_VERSION: &str = "0.15.2";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Then run the staged binary in Debian 11 and 13 userlands (chroots, as root): a daemon, a
    /// `leash run` whose host is SIGKILLed, its tree gone. Userlands are cached in
    /// /var/cache/leash-vmtest/userlands (LEASH_VMTEST_CACHE=DIR to change it).
    #[arg(long)]
    pub check: bool,
}

/// What `dist` staged.
pub(crate) struct Staged {
    pub dir: PathBuf,
    pub version: String,
}

impl Staged {
    pub(crate) fn binary(&self) -> PathBuf {
        self.dir.join("bin/leash")
    }

    /// The staging of the workspace's version, which must exist.
    pub(crate) fn existing() -> Result<Self> {
        let version = version()?;
        let staged = Self {
            dir: staging_dir(&version),
            version,
        };
        if !staged.binary().exists() {
            bail!(
                "{} is missing: run `cargo xtask dist` first",
                staged.binary().display()
            );
        }
        Ok(staged)
    }
}

pub(crate) fn dist(options: &Options) -> Result<()> {
    let staged = build_and_stage()?;
    if options.check {
        userland_check::check(&staged, None)?;
    }
    Ok(())
}

pub(crate) fn build_and_stage() -> Result<Staged> {
    setup()?;
    let python = ensure_zig()?;
    crate::ensure_cargo_subcommand(None, "zigbuild", CARGO_ZIGBUILD_VERSION)?;
    let root = workspace_root();
    eprintln!("xtask: building leash for {ZIG_TARGET} with cargo-zigbuild");
    status(
        crate::cargo_command()
            .args([
                "zigbuild",
                "--release",
                "--locked",
                "--package",
                "leash-user",
                "--bin",
                "leash",
                "--target",
                ZIG_TARGET,
            ])
            .env("CARGO_ZIGBUILD_PYTHON_PATH", &python)
            .current_dir(&root),
    )?;
    let built = root.join(TARGET_DIR).join("leash");
    let floor = glibc_floor(&built)?;
    if floor > GLIBC_FLOOR {
        bail!(
            "{} needs glibc {}.{}, newer than {}.{}",
            built.display(),
            floor.0,
            floor.1,
            GLIBC_FLOOR.0,
            GLIBC_FLOOR.1
        );
    }
    let staged = stage(&built)?;
    let size = fs::metadata(staged.binary())?.len();
    smoke_test(&staged.binary())?;
    println!(
        "dist: {} ({:.1} MiB, glibc {}.{} or later; libraries: {})",
        staged.binary().display(),
        size as f64 / (1024.0 * 1024.0),
        floor.0,
        floor.1,
        needed_libraries(&staged.binary())?.join(", ")
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

fn staging_dir(version: &str) -> PathBuf {
    workspace_root().join(format!("target/dist/leash-{version}-x86_64-linux"))
}

/// zig, from PyPI, in a virtual environment under target/dist; returns its Python, for
/// cargo-zigbuild's `CARGO_ZIGBUILD_PYTHON_PATH` (it runs `PYTHON -m ziglang`).
fn ensure_zig() -> Result<PathBuf> {
    let venv = workspace_root().join("target/dist/zig-venv");
    let python = venv.join("bin/python3");
    let installed = output(Command::new(&python).args(["-m", "ziglang", "version"]));
    if installed.is_ok_and(|v| v.trim() == ZIGLANG_VERSION) {
        return Ok(python);
    }
    eprintln!(
        "xtask: installing zig {ZIGLANG_VERSION} (PyPI's ziglang) into {}",
        venv.display()
    );
    fs::create_dir_all(venv.parent().context("a directory")?)?;
    if !python.exists() {
        status(Command::new("python3").args(["-m", "venv"]).arg(&venv)).context(
            "making a Python virtual environment (Debian/Ubuntu: apt-get install python3-venv)",
        )?;
    }
    status(Command::new(&python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("ziglang=={ZIGLANG_VERSION}"),
    ]))?;
    Ok(python)
}

/// The newest `GLIBC_x.y` version among the binary's dynamic symbols: the oldest glibc it
/// runs on.
pub(crate) fn glibc_floor(binary: &Path) -> Result<(u32, u32)> {
    let symbols = output(Command::new("objdump").arg("-T").arg(binary))
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
pub(crate) fn needed_libraries(binary: &Path) -> Result<Vec<String>> {
    let headers = output(Command::new("objdump").arg("-p").arg(binary))?;
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
fn stage(binary: &Path) -> Result<Staged> {
    let root = workspace_root();
    let version = version()?;
    let dir = staging_dir(&version);
    let _ = fs::remove_dir_all(&dir);
    let staged = Staged { dir, version };
    let dir = &staged.dir;

    let bin = staged.binary();
    fs::create_dir_all(bin.parent().context("a directory")?)?;
    fs::copy(binary, &bin).with_context(|| format!("copying to {}", bin.display()))?;

    let unit = dir.join("lib/systemd/system/leash.service");
    fs::create_dir_all(unit.parent().context("a directory")?)?;
    fs::copy(root.join("dist/leash.service"), &unit)?;

    let man = dir.join("share/man/man1");
    fs::create_dir_all(&man)?;
    if optional_subcommand(Command::new(&bin).arg("manpages").arg(&man), "man pages")?.is_none() {
        fs::remove_dir_all(dir.join("share/man"))?;
    }
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/leash"),
        ("zsh", "share/zsh/vendor-completions/_leash"),
        ("fish", "share/fish/vendor_completions.d/leash.fish"),
    ] {
        let script = optional_subcommand(
            Command::new(&bin).args(["completions", shell]),
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

/// Runs a subcommand that writes part of the staging; `None`, with a warning, where this
/// build's `leash` does not have it yet.
fn optional_subcommand(command: &mut Command, what: &str) -> Result<Option<Vec<u8>>> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if out.status.success() {
        return Ok(Some(out.stdout));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("unrecognized subcommand") {
        let args: Vec<_> = command.get_args().map(|a| a.to_string_lossy()).collect();
        eprintln!(
            "xtask: warning: this leash has no `leash {}`: the staging has no {what}",
            args.join(" ")
        );
        return Ok(None);
    }
    bail!("{command:?} failed: {}", stderr.trim())
}

/// The zig-linked binary starts, parses its arguments and prints its help.
fn smoke_test(binary: &Path) -> Result<()> {
    let version = output(Command::new(binary).arg("--version"))?;
    let help = output(Command::new(binary).args(["daemon", "--help"]))?;
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
    fn the_version_is_the_workspace_s() {
        assert_eq!(version().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
