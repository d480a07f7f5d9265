//! The kernels the suite boots: Debian's cloud kernels, pinned by package and version, fetched
//! with apt of their own suite and kept in the cache as the extracted vmlinuz (the .deb, mostly
//! modules the guests never load, is deleted).
//!
//! Debian drops superseded kernels from its archive. A pin that is gone does not fail the run:
//! the suite's newest kernel of the same line and flavour (what the pin's meta-package depends
//! on) runs instead, with a warning that names the pin to update.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::apt::Apt;

/// A kernel to test on.
pub(super) struct Pin {
    /// What `--kernel` names, and the per-kernel lines print.
    pub name: &'static str,
    /// The Debian suite that ships it (its -updates and -security are searched too).
    pub suite: &'static str,
    pub package: &'static str,
    pub version: &'static str,
    /// The suite's meta-package of this kernel line and flavour: its dependency is the newest
    /// such kernel, taken when the pin is gone from the archive.
    pub meta: &'static str,
}

/// The kernels users run, as Debian ships them (checked on deb.debian.org; update a pin when a
/// run warns that it is gone).
pub(super) const PINS: [Pin; 4] = [
    Pin {
        name: "bullseye-5.10",
        suite: "bullseye",
        package: "linux-image-5.10.0-46-cloud-amd64",
        version: "5.10.262-1",
        meta: "linux-image-cloud-amd64",
    },
    Pin {
        name: "bookworm-6.1",
        suite: "bookworm",
        package: "linux-image-6.1.0-57-cloud-amd64",
        version: "6.1.192-3",
        meta: "linux-image-cloud-amd64",
    },
    Pin {
        name: "bookworm-6.12",
        suite: "bookworm",
        package: "linux-image-6.12.117+deb12-cloud-amd64",
        version: "6.12.117-1~deb12u1",
        meta: "linux-image-6.12-cloud-amd64",
    },
    Pin {
        name: "trixie-6.12",
        suite: "trixie",
        package: "linux-image-6.12.118+deb13-cloud-amd64",
        version: "6.12.118-1",
        meta: "linux-image-cloud-amd64",
    },
];

/// A kernel ready to boot.
pub(crate) struct Kernel {
    pub name: &'static str,
    pub package: String,
    pub version: String,
    /// As `uname -r` prints it.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// False when the pin was gone and the suite's newest kernel stands in for it.
    pub pinned: bool,
}

/// Finds each pin's kernel in the cache, or fetches it into the cache. apt runs only for the
/// kernels not cached yet.
pub(super) fn resolve(pins: &[&'static Pin], cache: &Path) -> Result<Vec<Kernel>> {
    let mut apts: BTreeMap<&str, Apt> = BTreeMap::new();
    let mut kernels = Vec::new();
    for pin in pins {
        if let Some(kernel) = cached(cache, pin, pin.package, pin.version)? {
            kernels.push(kernel);
            continue;
        }
        let apt = match apts.entry(pin.suite) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(Apt::new(pin.suite, &cache.join("apt").join(pin.suite))?)
            }
        };
        apt.update()?;
        let (package, version) = if apt.offers(pin.package, pin.version)? {
            (pin.package.to_owned(), pin.version.to_owned())
        } else {
            let (package, version) = apt.newest_dependency(pin.meta)?;
            warn_gone(pin, &package, &version);
            (package, version)
        };
        if let Some(kernel) = cached(cache, pin, &package, &version)? {
            kernels.push(kernel);
            continue;
        }
        eprintln!("xtask: downloading {package} {version}");
        let downloads = cache.join("downloads");
        let deb = apt.download(&package, &version, &downloads)?;
        let extracted = extract(&deb, &kernel_dir(cache, &package, &version));
        let _ = fs::remove_file(&deb);
        extracted?;
        kernels.push(
            cached(cache, pin, &package, &version)?
                .context("the kernel just extracted is not in the cache")?,
        );
    }
    Ok(kernels)
}

fn warn_gone(pin: &Pin, package: &str, version: &str) {
    let rule = "=".repeat(78);
    eprintln!(
        "xtask: {rule}\nxtask: WARNING: the pinned kernel of {name}, {} {}, is gone from the \
         archive.\nxtask: Testing {suite}'s newest instead: {package} {version}.\nxtask: Update \
         the pin of {name} in xtask/src/vmtest/kernels.rs to it.\nxtask: {rule}",
        pin.package,
        pin.version,
        name = pin.name,
        suite = pin.suite,
    );
}

fn kernel_dir(cache: &Path, package: &str, version: &str) -> PathBuf {
    cache.join("kernels").join(format!("{package}_{version}"))
}

/// The kernel in the cache, if it was extracted there before.
fn cached(cache: &Path, pin: &Pin, package: &str, version: &str) -> Result<Option<Kernel>> {
    let dir = kernel_dir(cache, package, version);
    let vmlinuz = dir.join("vmlinuz");
    if !vmlinuz.is_file() {
        return Ok(None);
    }
    let release = fs::read_to_string(dir.join("release"))
        .with_context(|| format!("reading {}", dir.join("release").display()))?;
    Ok(Some(Kernel {
        name: pin.name,
        package: package.to_owned(),
        version: version.to_owned(),
        release: release.trim().to_owned(),
        vmlinuz,
        pinned: package == pin.package && version == pin.version,
    }))
}

/// Takes boot/vmlinuz-RELEASE and boot/config-RELEASE out of `deb` into `dir` (as vmlinuz,
/// config and a file `release`), through a directory renamed into place when complete.
fn extract(deb: &Path, dir: &Path) -> Result<()> {
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("making {}", partial.display()))?;
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar = Command::new("tar")
        .args(["-x", "--wildcards", "-C"])
        .arg(&partial)
        .args(["./boot/vmlinuz-*", "./boot/config-*"])
        .stdin(unpack.stdout.take().context("dpkg-deb's output")?)
        .status()
        .context("running tar")?;
    let unpacked = unpack.wait().context("waiting for dpkg-deb")?;
    if !unpacked.success() || !tar.success() {
        bail!(
            "extracting the kernel from {}: dpkg-deb {unpacked}, tar {tar}",
            deb.display()
        );
    }
    let boot = partial.join("boot");
    let release = fs::read_dir(&boot)?
        .flatten()
        .find_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            name.strip_prefix("vmlinuz-").map(str::to_owned)
        })
        .with_context(|| format!("{} holds no boot/vmlinuz-*", deb.display()))?;
    fs::rename(
        boot.join(format!("vmlinuz-{release}")),
        partial.join("vmlinuz"),
    )?;
    // The configuration is kept for whoever wonders what a kernel has built in.
    let _ = fs::rename(
        boot.join(format!("config-{release}")),
        partial.join("config"),
    );
    fs::remove_dir_all(&boot)?;
    fs::write(partial.join("release"), format!("{release}\n"))?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir).with_context(|| format!("moving the kernel to {}", dir.display()))
}

/// The pins `--kernel` names, in table order; all of them when none is named.
pub(super) fn select(names: &[String]) -> Result<Vec<&'static Pin>> {
    if names.is_empty() {
        return Ok(PINS.iter().collect());
    }
    for name in names {
        if !PINS.iter().any(|pin| pin.name == name) {
            bail!(
                "no kernel {name:?}; there are {}",
                PINS.map(|pin| pin.name).join(", ")
            );
        }
    }
    Ok(PINS
        .iter()
        .filter(|pin| names.iter().any(|name| name == pin.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_named_once_and_selected_in_table_order() {
        let all = select(&[]).unwrap();
        assert_eq!(all.len(), PINS.len());
        let names: std::collections::BTreeSet<_> = PINS.iter().map(|pin| pin.name).collect();
        assert_eq!(names.len(), PINS.len());
        let chosen = select(&["trixie-6.12".into(), "bullseye-5.10".into()]).unwrap();
        assert_eq!(
            chosen.iter().map(|pin| pin.name).collect::<Vec<_>>(),
            ["bullseye-5.10", "trixie-6.12"]
        );
        assert!(select(&["wheezy".into()]).is_err());
    }
}
