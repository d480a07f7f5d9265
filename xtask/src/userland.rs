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
pub(crate) struct Userland {
    /// Names the cached tarball: two userlands of one suite with other packages differ.
    pub name: &'static str,
    pub suite: &'static str,
    /// Packages beyond `--variant=minbase`.
    pub include: &'static [&'static str],
    /// Run in the new root before it is packed (`sh -ec`, chrooted), for what every run
    /// needs: users, masked units.
    pub prepare: &'static str,
}

/// Debian 11, the oldest userland the binary must run in (glibc 2.31).
pub(crate) const BULLSEYE: Userland = Userland {
    name: "bullseye",
    suite: "bullseye",
    include: &[],
    prepare: "",
};

/// Debian 13, the newest.
pub(crate) const TRIXIE: Userland = Userland {
    name: "trixie",
    suite: "trixie",
    include: &[],
    prepare: "",
};

/// Debian 12 with systemd as init, and an unprivileged user to run trees: the system test's
/// guest (systemtest/).
pub(crate) const BOOKWORM_SYSTEMD: Userland = Userland {
    name: "bookworm-systemd",
    suite: "bookworm",
    include: &["systemd", "systemd-sysv", "dbus", "procps"],
    // No login prompt on the console the host reads, and no timers of apt's own.
    prepare: "useradd --create-home --uid 1000 agent
        for unit in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
            apt-daily-upgrade.timer; do
            ln -sf /dev/null /etc/systemd/system/$unit
        done
        echo leash-systemtest > /etc/hostname",
};

/// Every userland the tests use.
pub(crate) const ALL: [&Userland; 3] = [&BULLSEYE, &TRIXIE, &BOOKWORM_SYSTEMD];

/// `cargo xtask userlands`: makes every userland not cached yet, all at once (fetching them is
/// most of their cost, and the archive serves them in parallel).
pub(crate) fn userlands() -> Result<()> {
    ensure_mmdebstrap()?;
    let started = Instant::now();
    let results: Vec<Result<PathBuf>> = std::thread::scope(|scope| {
        let makers: Vec<_> = ALL
            .iter()
            .map(|userland| scope.spawn(|| userland.tarball()))
            .collect();
        makers
            .into_iter()
            .map(|maker| {
                maker
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
            })
            .collect()
    });
    for (userland, result) in ALL.iter().zip(results) {
        let tarball = result.with_context(|| format!("the {} userland", userland.name))?;
        println!("{}: {}", userland.name, tarball.display());
    }
    println!("userlands ready in {:.0?}", started.elapsed());
    Ok(())
}

impl Userland {
    /// The cached tarball, made first if missing.
    pub(crate) fn tarball(&self) -> Result<PathBuf> {
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
    pub(crate) fn unpack(&self, root: &Path) -> Result<()> {
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
