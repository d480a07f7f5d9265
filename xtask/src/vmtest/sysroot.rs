//! The system of a guest whose architecture is not this machine's: the programs the tests run
//! (the same as the x86 guests take from this machine: initramfs.rs) and their libraries, from
//! Debian's packages of that architecture, extracted (never installed: nothing of it runs here)
//! by mmdebstrap into a directory of the cache, with merged /usr as this machine has it.

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, Result};

use super::{apt, arch::Arch, cache_dir};
use crate::{apt_install, status};

/// The Debian release the programs come from: this machine's, so that the guests run the
/// programs the x86 guests run, at the same versions.
const SUITE: &str = "bookworm";

/// The packages of the programs the tests run, and of busybox; apt adds their dependencies.
const PACKAGES: [&str; 8] = [
    "busybox-static",
    "bash",
    "dash",
    "coreutils",
    "util-linux",
    "mount",
    "procps",
    "python3",
];

/// The extracted system of `arch`, made first if it is not cached (a minute and a half, once;
/// in LEASH_VMTEST_CACHE/userlands/guest-ARCH).
pub(super) fn sysroot(arch: Arch) -> Result<PathBuf> {
    let dir = cache_dir()
        .join("userlands")
        .join(format!("guest-{}", arch.debian()));
    // What it was made of: a change of the list makes it again.
    let recipe = format!("{SUITE} {}\n", PACKAGES.join(" "));
    let recipe_file = dir.join("leash-vmtest-recipe");
    if fs::read_to_string(&recipe_file).is_ok_and(|made| made == recipe) {
        return Ok(dir);
    }
    ensure_mmdebstrap()?;
    apt::ensure_keyring()?;
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).with_context(|| format!("making {}", parent.display()))?;
    }
    eprintln!(
        "xtask: extracting Debian {SUITE}'s {} programs with mmdebstrap (once; cached in {})",
        arch.debian(),
        dir.display()
    );
    let started = Instant::now();
    let mut mmdebstrap = Command::new("mmdebstrap");
    mmdebstrap
        .args(["--quiet", "--variant=extract", "--format=directory"])
        .arg(format!("--arch={}", arch.debian()))
        .arg(format!("--include={}", PACKAGES.join(",")))
        // /bin -> usr/bin as on this machine: the tests name programs by either path.
        .arg("--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr");
    for path in [
        "/usr/share/doc/*",
        "/usr/share/man/*",
        "/usr/share/locale/*",
        "/usr/share/info/*",
    ] {
        mmdebstrap.arg(format!("--dpkgopt=path-exclude={path}"));
    }
    mmdebstrap
        .arg(SUITE)
        .arg(&partial)
        .arg(format!("{}/debian", apt::mirror()));
    status(&mut mmdebstrap)?;
    fs::write(partial.join("leash-vmtest-recipe"), &recipe)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).with_context(|| format!("moving it to {}", dir.display()))?;
    eprintln!(
        "xtask: the {} programs took {:.0?}",
        arch.debian(),
        started.elapsed()
    );
    Ok(dir)
}

fn ensure_mmdebstrap() -> Result<()> {
    if std::path::Path::new("/usr/bin/mmdebstrap").is_file() {
        return Ok(());
    }
    apt_install(&["mmdebstrap"], false)
}
