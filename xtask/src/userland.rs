//! Debian userlands made by `mmdebstrap` from Debian's archive, each cached as a tarball beside
//! the vmtest kernels (/var/cache/leash-vmtest/userlands, or under `LEASH_VMTEST_CACHE`), and
//! unpacked afresh for each run: a run changes its copy (installs packages, makes users), never
//! the cache. mmdebstrap rather than debootstrap: it resolves with apt and downloads in
//! parallel, in half debootstrap's time here (bookworm with systemd: 91 s against 172 s), and
//! writes the tarball itself.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result};

use crate::{apt_install, status, vmtest};

/// What no test reads: documentation and translations, a third of a minimal root.
const EXCLUDED: [&str; 4] = [
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/locale/*",
    "/usr/share/info/*",
];

/// A userland: a suite and what it holds beyond the minimal base.
pub struct Userland {
    /// Names the cached tarball: two userlands of one suite with other packages differ.
    pub name: &'static str,
    pub suite: &'static str,
    /// Packages beyond `--variant=minbase`.
    pub include: &'static [&'static str],
    /// Run in the new root before it is packed (`sh -ec`, chrooted), for what every run
    /// needs: users, masked units.
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
        ensure_mmdebstrap()?;
        fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
        let started = Instant::now();
        eprintln!(
            "xtask: making the {} userland with mmdebstrap (once; cached in {})",
            self.name,
            tarball.display()
        );
        let partial = tarball.with_extension("tar.partial");
        let mut mmdebstrap = Command::new("mmdebstrap");
        mmdebstrap.args(["--quiet", "--variant=minbase", "--format=tar"]);
        for path in EXCLUDED {
            mmdebstrap.arg(format!("--dpkgopt=path-exclude={path}"));
        }
        if !self.include.is_empty() {
            mmdebstrap.arg(format!("--include={}", self.include.join(",")));
        }
        if !self.prepare.is_empty() {
            let script = self.prepare.replace('\'', "'\\''");
            mmdebstrap.arg(format!("--customize-hook=chroot \"$1\" sh -ec '{script}'"));
        }
        mmdebstrap
            .arg(self.suite)
            .arg(&partial)
            .arg(format!("{}/debian", vmtest::mirror()));
        status(&mut mmdebstrap)?;
        fs::rename(&partial, &tarball)
            .with_context(|| format!("moving the userland to {}", tarball.display()))?;
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

fn ensure_mmdebstrap() -> Result<()> {
    if Path::new("/usr/bin/mmdebstrap").is_file() {
        return Ok(());
    }
    apt_install(&["mmdebstrap"], false)
}
