//! Debian userlands made by `debootstrap` from Debian's archive, each cached as a tarball beside
//! the vmtest kernels (/var/cache/leash-vmtest/userlands, or under `LEASH_VMTEST_CACHE`), and
//! unpacked afresh for each run: a run changes its copy (installs packages, makes users), never
//! the cache.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result};

use crate::{apt_install, status, vmtest};

/// A userland: a suite and what it holds beyond the minimal base.
pub struct Userland {
    /// Names the cached tarball: two userlands of one suite with other packages differ.
    pub name: &'static str,
    pub suite: &'static str,
    /// Packages beyond `--variant=minbase`.
    pub include: &'static [&'static str],
    /// Run in the new root before it is packed (`sh -c`, chrooted), for what every run needs:
    /// users, masked units.
    pub prepare: &'static str,
}

impl Userland {
    /// The cached tarball, made first if missing.
    pub fn tarball(&self) -> Result<PathBuf> {
        let dir = vmtest::cache_dir().join("userlands");
        let tarball = dir.join(format!("{}.tar", self.name));
        if tarball.is_file() {
            return Ok(tarball);
        }
        ensure_debootstrap()?;
        fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        let root = dir.join(format!("{}.partial", self.name));
        let _ = fs::remove_dir_all(&root);
        let started = Instant::now();
        eprintln!(
            "xtask: making the {} userland with debootstrap (once; cached in {})",
            self.name,
            tarball.display()
        );
        let mut debootstrap = Command::new("debootstrap");
        debootstrap.arg("--variant=minbase");
        if !self.include.is_empty() {
            debootstrap.arg(format!("--include={}", self.include.join(",")));
        }
        debootstrap
            .arg(self.suite)
            .arg(&root)
            .arg(format!("{}/debian", vmtest::mirror()));
        status(&mut debootstrap)?;
        status(Command::new("chroot").arg(&root).args([
            "/bin/sh",
            "-ec",
            &format!(
                "{}\napt-get clean\nrm -rf /var/lib/apt/lists/*",
                self.prepare
            ),
        ]))?;
        // Documentation and translations: a third of the root, and nothing a test reads.
        for path in [
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
            "usr/share/info",
        ] {
            let _ = fs::remove_dir_all(root.join(path));
        }
        let partial = tarball.with_extension("tar.partial");
        status(
            Command::new("tar")
                .arg("--create")
                .arg("--file")
                .arg(&partial)
                .arg("--directory")
                .arg(&root)
                .args(["--numeric-owner", "."]),
        )?;
        fs::rename(&partial, &tarball)
            .with_context(|| format!("moving the userland to {}", tarball.display()))?;
        let _ = fs::remove_dir_all(&root);
        eprintln!(
            "xtask: the {} userland took {:.0?}",
            self.name,
            started.elapsed()
        );
        Ok(tarball)
    }

    /// A fresh copy of the userland at `root` (anything there before is removed).
    pub fn unpack(&self, root: &Path) -> Result<()> {
        let tarball = self.tarball()?;
        if root.exists() {
            fs::remove_dir_all(root).with_context(|| format!("removing {}", root.display()))?;
        }
        fs::create_dir_all(root).with_context(|| format!("making {}", root.display()))?;
        status(
            Command::new("tar")
                .arg("--extract")
                .arg("--file")
                .arg(&tarball)
                .arg("--directory")
                .arg(root)
                .args(["--numeric-owner", "--preserve-permissions"]),
        )
    }
}

fn ensure_debootstrap() -> Result<()> {
    if Path::new("/usr/sbin/debootstrap").is_file() {
        return Ok(());
    }
    apt_install(&["debootstrap"], false)
}
