//! apt with a configuration of its own, one per Debian suite: its sources list, package lists and
//! cache live in the vmtest cache, so the machine's apt (its suites, its pins, its state) is
//! neither read nor changed. Only the system's apt.conf.d is shared, for a proxy it may set.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::arch::Arch;
use crate::{is_root, output, status};

/// The key that signs every Debian suite's Release file (the debian-archive-keyring package).
pub(crate) const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Where the packages come from; `LEASH_VMTEST_MIRROR` replaces it (the security archive is
/// MIRROR/debian-security).
const DEFAULT_MIRROR: &str = "http://deb.debian.org";
pub(crate) const MIRROR_VAR: &str = "LEASH_VMTEST_MIRROR";

/// Debian's archive, or the mirror `LEASH_VMTEST_MIRROR` names (without a trailing slash).
pub(crate) fn mirror() -> String {
    let mirror = std::env::var(MIRROR_VAR).unwrap_or_else(|_| DEFAULT_MIRROR.to_owned());
    mirror.trim_end_matches('/').to_owned()
}

pub(crate) struct Apt {
    suite: String,
    arch: Arch,
    dir: PathBuf,
    updated: bool,
}

/// The suites with no -updates and no -security: their packages change in place.
const ROLLING: [&str; 3] = ["unstable", "sid", "experimental"];

impl Apt {
    /// The apt of `suite` (bullseye, bookworm...) for `arch`, its state under `dir`: the suite
    /// itself, its -updates and its -security (those a release has).
    pub(crate) fn new(suite: &str, arch: Arch, dir: &Path) -> Result<Self> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path).with_context(|| format!("making {}", path.display()))?;
        }
        let mirror = mirror();
        let mut sources = vec![format!("{mirror}/debian {suite}")];
        if !ROLLING.contains(&suite) {
            sources.push(format!("{mirror}/debian {suite}-updates"));
            sources.push(format!("{mirror}/debian-security {suite}-security"));
        }
        let sources: String = sources
            .iter()
            .map(|source| format!("deb [signed-by={KEYRING}] {source} main\n"))
            .collect();
        let list = dir.join("sources.list");
        fs::write(&list, sources).with_context(|| format!("writing {}", list.display()))?;
        Ok(Self {
            suite: suite.to_owned(),
            arch,
            dir: dir.to_path_buf(),
            updated: false,
        })
    }

    /// Fetches the suite's package lists, once per run.
    pub(crate) fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        ensure_keyring()?;
        eprintln!("xtask: fetching the package lists of {}", self.suite);
        status(self.command("apt-get").args(["-qq", "update"]))
            .with_context(|| format!("fetching {}'s package lists", self.suite))?;
        self.updated = true;
        Ok(())
    }

    /// Whether the suite offers `package` at exactly `version`.
    pub(crate) fn offers(&self, package: &str, version: &str) -> Result<bool> {
        let listing = output(self.command("apt-cache").args(["madison", package]))?;
        Ok(listing
            .lines()
            .any(|line| line.split('|').nth(1).is_some_and(|v| v.trim() == version)))
    }

    /// The kernel package that `meta` (a meta-package such as linux-image-cloud-amd64) depends
    /// on in its newest version, and that package's newest version.
    pub(crate) fn newest_dependency(&self, meta: &str) -> Result<(String, String)> {
        let depends = output(self.command("apt-cache").args([
            "depends",
            "--no-recommends",
            "--no-suggests",
            meta,
        ]))?;
        // Newer meta-packages depend on a linux-base-FLAVOUR first.
        let package = depends
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|name| name.starts_with("linux-image-"))
            .with_context(|| format!("{meta} depends on no kernel package in {}", self.suite))?
            .to_owned();
        let policy = output(self.command("apt-cache").args(["policy", &package]))?;
        let version = policy
            .lines()
            .find_map(|line| line.trim().strip_prefix("Candidate: "))
            .filter(|version| *version != "(none)")
            .with_context(|| format!("{package} has no version in {}", self.suite))?
            .to_owned();
        Ok((package, version))
    }

    /// What `meta` depends on, as [`Self::newest_dependency`], or None when the suite has no
    /// `meta` at all (experimental has one only while a new kernel line is tried there).
    pub(crate) fn dependency(&self, meta: &str) -> Result<Option<(String, String)>> {
        let listing = output(self.command("apt-cache").args(["madison", meta]))?;
        if listing.trim().is_empty() {
            return Ok(None);
        }
        self.newest_dependency(meta).map(Some)
    }

    /// The package that holds the kernel of image package `package`: itself, or, as Debian
    /// splits them from Linux 7.3 on (experimental), the `linux-binary-*` package it depends
    /// on, at the same version.
    pub(crate) fn kernel_holder(&self, package: &str) -> Result<String> {
        let depends = output(self.command("apt-cache").args([
            "depends",
            "--no-recommends",
            "--no-suggests",
            package,
        ]))?;
        Ok(depends
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|name| name.starts_with("linux-binary-"))
            .unwrap_or(package)
            .to_owned())
    }

    /// Downloads `package` at `version` into `dir`; returns the .deb.
    pub(crate) fn download(&self, package: &str, version: &str, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
        status(
            self.command("apt-get")
                .args(["-qq", "download", &format!("{package}={version}")])
                .current_dir(dir),
        )?;
        // apt names it PACKAGE_VERSION_ARCH.deb, with the version's epoch colon escaped.
        let prefix = format!("{package}_{}_", version.replace(':', "%3a"));
        fs::read_dir(dir)?
            .flatten()
            .map(|entry| entry.path())
            .find(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
            })
            .with_context(|| {
                format!(
                    "apt-get download left no {prefix}*.deb in {}",
                    dir.display()
                )
            })
    }

    fn command(&self, program: &str) -> Command {
        let dir = &self.dir;
        let mut command = Command::new(program);
        for option in [
            format!(
                "Dir::Etc::SourceList={}",
                dir.join("sources.list").display()
            ),
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            format!("Dir::Cache={}", dir.join("cache").display()),
            format!("APT::Architecture={}", self.arch.debian()),
            format!("APT::Architectures={}", self.arch.debian()),
            // Nothing of the machine's own packages or preferences.
            "Dir::State::Status=/dev/null".to_owned(),
            "Dir::Etc::Preferences=/dev/null".to_owned(),
            "Dir::Etc::PreferencesParts=/dev/null".to_owned(),
            // The package lists alone: no translations, no AppStream metadata.
            "Acquire::Languages=none".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".to_owned(),
            "Acquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false".to_owned(),
        ] {
            command.arg("-o").arg(option);
        }
        if is_root() {
            // apt's download user could not write into the cache, and says so at every file.
            command.args(["-o", "APT::Sandbox::User=root"]);
        }
        command
    }
}

pub(crate) fn ensure_keyring() -> Result<()> {
    if Path::new(KEYRING).exists() {
        return Ok(());
    }
    if !is_root() || !Path::new("/usr/bin/apt-get").exists() {
        bail!("{KEYRING} is missing: install debian-archive-keyring");
    }
    crate::apt_install(&["debian-archive-keyring"], false)
}
