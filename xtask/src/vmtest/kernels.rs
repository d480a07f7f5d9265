//! The kernels the suite boots: Debian's cloud kernels, pinned by package and version, fetched
//! with apt of their own suite and kept in the cache as the extracted vmlinuz (the .deb, mostly
//! modules the guests never load, is deleted).
//!
//! Debian drops superseded kernels from its archive. A pin that is gone does not fail the run:
//! the suite's newest kernel of the same line and flavour (what the pin's meta-package depends
//! on) runs instead, with a warning that names the pin to update.
//!
//! One kernel is not pinned: `sid-newest`, the newest cloud kernel Debian ships (unstable's, or
//! experimental's when that is newer), looked up at each run, so that a kernel change that
//! breaks leash shows before the kernel reaches a release. It fails the run only when no such
//! kernel can be found. `sid-newest-nolsm` boots the same kernel with an `lsm=` list that lacks
//! `bpf`, as a distribution whose default list lacks it (Ubuntu's) runs it.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use super::{apt::Apt, arch::Arch};

/// A kernel to test on.
pub(super) struct Pin {
    /// What `--kernel` names, and the per-kernel lines print.
    pub name: &'static str,
    pub arch: Arch,
    /// The Debian suite that ships it (its -updates and -security are searched too).
    pub suite: &'static str,
    pub choice: Choice,
    /// The suite's meta-package of this kernel line and flavour: its dependency is the newest
    /// such kernel, taken when the pin is gone from the archive.
    pub meta: &'static str,
    /// None: in the set a run without `--kernel` boots. Some(why): only when named, and why
    /// (`--list` says it).
    pub only_named: Option<&'static str>,
    /// Words added to the kernel's command line (`lsm=...`), or empty.
    pub cmdline: &'static str,
    /// When one or two scenarios fail, they run once more in a new guest, and their second run
    /// counts (`RETRIED_ON_THE_NEWEST` in mod.rs): the newest kernel without the BPF LSM, which
    /// skips the tracepoint programs now and then, and has no marks to make up for it.
    pub retried: bool,
    /// The kernel has BPF trampolines on kernel functions (x86_64 since 5.5, arm64 since 6.4,
    /// with ftrace's direct calls), so it attaches the ptrace guard's LSM or fmod_ret program,
    /// and the guest's `ptrace_guard` requires one; elsewhere the daemon's syscall-tracepoint
    /// fallback is the guard, and the test checks that one.
    pub trampolines: bool,
}

/// Which kernel of its suite a [`Pin`] is.
pub(super) enum Choice {
    /// This package at this version (the suite's newest of the same line when it is gone).
    Pinned {
        package: &'static str,
        version: &'static str,
    },
    /// The newest that the meta-package depends on, in the suite or in any of `also`, looked
    /// up when the run starts.
    Newest { also: &'static [&'static str] },
}

impl Pin {
    /// What the table says it is, for `--list`.
    pub(super) fn describe(&self) -> String {
        match self.choice {
            Choice::Pinned { package, version } => {
                format!("{package} {version} ({})", self.suite)
            }
            Choice::Newest { also } => format!(
                "the newest kernel {} depends on in {}, looked up at each run",
                self.meta,
                [self.suite]
                    .iter()
                    .chain(also)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        }
    }

    fn is(&self, package: &str, version: &str) -> bool {
        match self.choice {
            Choice::Pinned {
                package: pinned,
                version: at,
            } => package == pinned && version == at,
            Choice::Newest { .. } => true,
        }
    }
}

/// `lsm=` as Debian's kernels have it built in but for `bpf` (trixie's 6.12: CONFIG_LSM=
/// "landlock,lockdown,yama,loadpin,safesetid,integrity,apparmor,selinux,smack,tomoyo,bpf,ipe").
/// A kernel leaves out at boot those it was built without (`integrity` is `ima` and `evm` from
/// 6.9, which are on whatever the list says).
const NO_BPF_LSM: &str =
    "lsm=landlock,lockdown,yama,loadpin,safesetid,integrity,apparmor,selinux,smack,tomoyo,ipe";

/// The kernels users run, as Debian ships them (checked on deb.debian.org; update a pin when a
/// run warns that it is gone). bookworm-6.12 is out of the default set: the same upstream line
/// as trixie-6.12, and CI has no minutes for a fifth x86 guest; so is sid-newest-nolsm, a
/// second boot of sid-newest's kernel.
pub(super) const PINS: [Pin; 8] = [
    Pin {
        name: "bullseye-5.10",
        arch: Arch::X86_64,
        suite: "bullseye",
        choice: Choice::Pinned {
            package: "linux-image-5.10.0-46-cloud-amd64",
            version: "5.10.262-1",
        },
        meta: "linux-image-cloud-amd64",
        only_named: None,
        cmdline: "",
        retried: false,
        trampolines: true,
    },
    Pin {
        name: "bookworm-6.1",
        arch: Arch::X86_64,
        suite: "bookworm",
        choice: Choice::Pinned {
            package: "linux-image-6.1.0-57-cloud-amd64",
            version: "6.1.192-3",
        },
        meta: "linux-image-cloud-amd64",
        only_named: None,
        cmdline: "",
        retried: false,
        trampolines: true,
    },
    Pin {
        name: "bookworm-6.12",
        arch: Arch::X86_64,
        suite: "bookworm",
        choice: Choice::Pinned {
            package: "linux-image-6.12.117+deb12-cloud-amd64",
            version: "6.12.117-1~deb12u1",
        },
        meta: "linux-image-6.12-cloud-amd64",
        only_named: Some("the same upstream line as trixie-6.12"),
        cmdline: "",
        retried: false,
        trampolines: true,
    },
    Pin {
        name: "trixie-6.12",
        arch: Arch::X86_64,
        suite: "trixie",
        choice: Choice::Pinned {
            package: "linux-image-6.12.118+deb13-cloud-amd64",
            version: "6.12.118-1",
        },
        meta: "linux-image-cloud-amd64",
        only_named: None,
        cmdline: "",
        retried: false,
        trampolines: true,
    },
    Pin {
        name: "sid-newest",
        arch: Arch::X86_64,
        suite: "unstable",
        choice: Choice::Newest {
            also: &["experimental"],
        },
        meta: "linux-image-cloud-amd64",
        only_named: None,
        cmdline: "",
        // No second run: its marks keep every fork seen, and a second chance would hide an
        // escape.
        retried: false,
        trampolines: true,
    },
    // The same kernel with the BPF LSM left out, standing in for Ubuntu 26.04's 7.0: Ubuntu's
    // lsm list lacks bpf (22.04 and 24.04; 26.04 not confirmed, so assumed). Membership is
    // layered there: any test of tracking can meet a fork both programs were skipped for, and
    // one or two failed scenarios run again. (The membership scenarios report the escapes as a
    // figure there rather than fail on them.)
    Pin {
        name: "sid-newest-nolsm",
        arch: Arch::X86_64,
        suite: "unstable",
        choice: Choice::Newest {
            also: &["experimental"],
        },
        meta: "linux-image-cloud-amd64",
        only_named: Some("sid-newest's kernel without the BPF LSM, as Ubuntu boots its kernels"),
        cmdline: NO_BPF_LSM,
        retried: true,
        trampolines: true,
    },
    Pin {
        name: "bookworm-6.1",
        arch: Arch::Aarch64,
        suite: "bookworm",
        choice: Choice::Pinned {
            package: "linux-image-6.1.0-57-cloud-arm64",
            version: "6.1.192-3",
        },
        meta: "linux-image-cloud-arm64",
        only_named: None,
        cmdline: "",
        retried: false,
        // The attach fails with ENOTSUPP (524): no ftrace direct calls on arm64 before 6.4.
        trampolines: false,
    },
    Pin {
        name: "trixie-6.12",
        arch: Arch::Aarch64,
        suite: "trixie",
        choice: Choice::Pinned {
            package: "linux-image-6.12.118+deb13-cloud-arm64",
            version: "6.12.118-1",
        },
        meta: "linux-image-cloud-arm64",
        only_named: None,
        cmdline: "",
        retried: false,
        trampolines: true,
    },
];

/// A kernel ready to boot.
pub(crate) struct Kernel {
    pub name: &'static str,
    pub arch: Arch,
    pub package: String,
    pub version: String,
    /// As `uname -r` prints it.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// False when the pin was gone and the suite's newest kernel stands in for it.
    pub pinned: bool,
    /// Looked up at this run ([`Choice::Newest`]): the lines name its package.
    pub newest: bool,
    /// [`Pin::trampolines`].
    pub trampolines: bool,
    /// [`Pin::cmdline`].
    pub cmdline: &'static str,
    /// [`Pin::retried`].
    pub retried: bool,
}

/// Finds each pin's kernel in the cache, or fetches it into the cache. apt runs only for the
/// kernels not cached yet, and for those looked up at each run.
pub(super) fn resolve(pins: &[&'static Pin], cache: &Path) -> Result<Vec<Kernel>> {
    let mut apts = Apts {
        cache,
        apts: BTreeMap::new(),
    };
    let mut kernels = Vec::new();
    for pin in pins {
        let (package, version, from) = match pin.choice {
            Choice::Pinned { package, version } => {
                if let Some(kernel) = cached(cache, pin, package, version)? {
                    kernels.push(kernel);
                    continue;
                }
                let apt = apts.get(pin.suite, pin.arch)?;
                if apt.offers(package, version)? {
                    (package.to_owned(), version.to_owned(), pin.suite)
                } else {
                    let (package, version) = apt.newest_dependency(pin.meta)?;
                    warn_gone(pin, package_and_version(pin), &package, &version);
                    (package, version, pin.suite)
                }
            }
            Choice::Newest { also } => {
                let mut newest: Option<(String, String, &'static str)> = None;
                for &suite in [pin.suite].iter().chain(also) {
                    let apt = apts.get(suite, pin.arch)?;
                    // experimental often has no cloud kernel of its own: then unstable's is
                    // the newest.
                    let Some((package, version)) = apt.dependency(pin.meta)? else {
                        eprintln!("xtask: {suite} has no {} ({})", pin.meta, pin.arch.debian());
                        continue;
                    };
                    let newer = match &newest {
                        None => true,
                        Some((_, best, _)) => version_newer(&version, best)?,
                    };
                    if newer {
                        newest = Some((package, version, suite));
                    }
                }
                newest.with_context(|| {
                    format!(
                        "{}: no suite of {} has a kernel that {} depends on; the run needs \
                         one (is the mirror {} reachable?)",
                        pin.name,
                        pin.describe(),
                        pin.meta,
                        super::apt::mirror()
                    )
                })?
            }
        };
        if pin.newest() {
            eprintln!("xtask: {} is {package} {version}, from {from}", pin.name);
        }
        if let Some(kernel) = cached(cache, pin, &package, &version)? {
            kernels.push(kernel);
            continue;
        }
        eprintln!("xtask: downloading {package} {version}");
        let downloads = cache.join("downloads");
        let apt = apts.get(from, pin.arch)?;
        let holder = apt.kernel_holder(&package)?;
        if holder != package {
            eprintln!("xtask: its kernel is in {holder}");
        }
        let deb = apt.download(&holder, &version, &downloads)?;
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

/// Each suite's apt, made and updated when first needed.
struct Apts<'a> {
    cache: &'a Path,
    apts: BTreeMap<(&'static str, Arch), Apt>,
}

impl Apts<'_> {
    fn get(&mut self, suite: &'static str, arch: Arch) -> Result<&mut Apt> {
        let apt = match self.apts.entry((suite, arch)) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(Apt::new(suite, arch, &apt_dir(self.cache, suite, arch))?)
            }
        };
        apt.update()?;
        Ok(apt)
    }
}

impl Pin {
    fn newest(&self) -> bool {
        matches!(self.choice, Choice::Newest { .. })
    }
}

fn package_and_version(pin: &Pin) -> (&'static str, &'static str) {
    match pin.choice {
        Choice::Pinned { package, version } => (package, version),
        Choice::Newest { .. } => ("", ""),
    }
}

/// Each suite's apt state: the x86 ones where they always were, other architectures beside.
fn apt_dir(cache: &Path, suite: &str, arch: Arch) -> PathBuf {
    let apt = cache.join("apt");
    match arch {
        Arch::X86_64 => apt.join(suite),
        _ => apt.join(format!("{suite}-{}", arch.debian())),
    }
}

/// Whether Debian version `a` is newer than `b` (dpkg's own comparison).
fn version_newer(a: &str, b: &str) -> Result<bool> {
    Ok(Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .context("running dpkg --compare-versions")?
        .success())
}

fn warn_gone(pin: &Pin, (pinned, at): (&str, &str), package: &str, version: &str) {
    let rule = "=".repeat(78);
    eprintln!(
        "xtask: {rule}\nxtask: WARNING: the pinned kernel of {name} ({arch}), {pinned} {at}, is \
         gone from the archive.\nxtask: Testing {suite}'s newest instead: {package} \
         {version}.\nxtask: Update the pin of {name} in xtask/src/vmtest/kernels.rs to it.\n\
         xtask: {rule}",
        name = pin.name,
        arch = pin.arch.debian(),
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
        arch: pin.arch,
        package: package.to_owned(),
        version: version.to_owned(),
        release: release.trim().to_owned(),
        vmlinuz,
        pinned: pin.is(package, version),
        newest: pin.newest(),
        trampolines: pin.trampolines,
        cmdline: pin.cmdline,
        retried: pin.retried,
    }))
}

/// Takes the kernel and its configuration out of `deb` into `dir` (as vmlinuz, config and a
/// file `release`), through a directory renamed into place when complete. Debian's packages
/// have them as boot/vmlinuz-RELEASE and boot/config-RELEASE, or from Linux 7.3 on as
/// usr/lib/modules/RELEASE/vmlinuz (and config, where the package has it).
fn extract(deb: &Path, dir: &Path) -> Result<()> {
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("making {}", partial.display()))?;
    let contents = crate::output(Command::new("dpkg-deb").arg("--contents").arg(deb))?;
    let members = kernel_members(&contents);
    let release = members
        .iter()
        .find(|member| member.kernel)
        .map(|member| member.release.clone())
        .with_context(|| {
            format!(
                "{} holds no kernel (boot/vmlinuz-* or usr/lib/modules/*/vmlinuz)",
                deb.display()
            )
        })?;
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("running dpkg-deb")?;
    let tar = Command::new("tar")
        .args(["-x", "-C"])
        .arg(&partial)
        .args(members.iter().map(|member| &member.path))
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
    for member in &members {
        // The configuration is kept for whoever wonders what a kernel has built in.
        let name = if member.kernel { "vmlinuz" } else { "config" };
        fs::rename(partial.join(&member.path), partial.join(name))?;
    }
    for top in ["boot", "usr"] {
        let _ = fs::remove_dir_all(partial.join(top));
    }
    fs::write(partial.join("release"), format!("{release}\n"))?;
    let _ = fs::remove_dir_all(dir);
    fs::rename(&partial, dir).with_context(|| format!("moving the kernel to {}", dir.display()))
}

/// A file of a kernel package that the cache keeps.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    /// As the package's archive names it (`./boot/vmlinuz-6.1.0-57-cloud-amd64`).
    path: String,
    /// As `uname -r` prints it.
    release: String,
    /// The kernel, else its configuration.
    kernel: bool,
}

/// The kernels and configurations a `dpkg-deb --contents` listing names (regular files only).
fn kernel_members(contents: &str) -> Vec<Member> {
    contents
        .lines()
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter_map(|path| {
            let (release, kernel) = if let Some(boot) = path.strip_prefix("./boot/") {
                match boot.split_once('-')? {
                    ("vmlinuz", release) => (release, true),
                    ("config", release) => (release, false),
                    _ => return None,
                }
            } else {
                let (release, file) = path.strip_prefix("./usr/lib/modules/")?.split_once('/')?;
                match file {
                    "vmlinuz" => (release, true),
                    "config" => (release, false),
                    _ => return None,
                }
            };
            Some(Member {
                path: path.to_owned(),
                release: release.to_owned(),
                kernel,
            })
        })
        .collect()
}

/// The pins of `arch` that `--kernel` names, in table order; the default set when none is
/// named.
pub(super) fn select(names: &[String], arch: Arch) -> Result<Vec<&'static Pin>> {
    let of_arch = || PINS.iter().filter(move |pin| pin.arch == arch);
    if names.is_empty() {
        return Ok(of_arch().filter(|pin| pin.only_named.is_none()).collect());
    }
    for name in names {
        if !of_arch().any(|pin| pin.name == name) {
            bail!(
                "no kernel {name:?} for {}; there are {}",
                arch.debian(),
                of_arch().map(|pin| pin.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    Ok(of_arch()
        .filter(|pin| names.iter().any(|name| name == pin.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_named_once_per_arch_and_selected_in_table_order() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let pins: Vec<_> = PINS.iter().filter(|pin| pin.arch == arch).collect();
            let names: std::collections::BTreeSet<_> = pins.iter().map(|pin| pin.name).collect();
            assert_eq!(names.len(), pins.len(), "{arch:?}");
        }
        let chosen = select(
            &["trixie-6.12".into(), "bullseye-5.10".into()],
            Arch::X86_64,
        )
        .unwrap();
        assert_eq!(
            chosen.iter().map(|pin| pin.name).collect::<Vec<_>>(),
            ["bullseye-5.10", "trixie-6.12"]
        );
        assert!(select(&["wheezy".into()], Arch::X86_64).is_err());
        assert!(select(&["bullseye-5.10".into()], Arch::Aarch64).is_err());
        let arm64 = select(&["trixie-6.12".into()], Arch::Aarch64).unwrap();
        assert_eq!(arm64[0].arch, Arch::Aarch64);
        assert!(arm64[0].meta.ends_with("-arm64"));
    }

    #[test]
    fn the_default_set_is_one_kernel_per_line_and_the_newest() {
        let names = |arch| {
            select(&[], arch)
                .unwrap()
                .iter()
                .map(|pin| pin.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(Arch::X86_64),
            ["bullseye-5.10", "bookworm-6.1", "trixie-6.12", "sid-newest"]
        );
        assert_eq!(names(Arch::Aarch64), ["bookworm-6.1", "trixie-6.12"]);
        // Still runnable by name.
        for name in ["bookworm-6.12", "sid-newest-nolsm"] {
            let chosen = select(&[name.into()], Arch::X86_64).unwrap();
            assert_eq!(chosen.len(), 1, "{name}");
            assert!(chosen[0].only_named.is_some(), "{name}");
        }
    }

    #[test]
    fn the_newest_kernel_is_booted_again_without_the_bpf_lsm_and_only_that_line_retried() {
        let pin = |name: &str| PINS.iter().find(|pin| pin.name == name).unwrap();
        let (newest, nolsm) = (pin("sid-newest"), pin("sid-newest-nolsm"));
        // The same kernel, looked up the same way.
        assert!(matches!(
            (&newest.choice, &nolsm.choice),
            (Choice::Newest { also: a }, Choice::Newest { also: b }) if a == b
        ));
        assert_eq!(
            (newest.suite, newest.meta, newest.arch, newest.trampolines),
            (nolsm.suite, nolsm.meta, nolsm.arch, nolsm.trampolines)
        );
        // Booted with a list of LSMs, one word, that lacks bpf alone of Debian's.
        assert_eq!(newest.cmdline, "");
        let lsms = nolsm.cmdline.strip_prefix("lsm=").unwrap();
        assert!(!nolsm.cmdline.contains(char::is_whitespace));
        let lsms: Vec<&str> = lsms.split(',').collect();
        assert!(!lsms.contains(&"bpf"));
        for kept in ["lockdown", "yama", "landlock", "apparmor"] {
            assert!(lsms.contains(&kept), "{kept}");
        }
        // Only the line without the marks gets a second run.
        let retried: Vec<_> = PINS
            .iter()
            .filter(|pin| pin.retried)
            .map(|pin| pin.name)
            .collect();
        assert_eq!(retried, ["sid-newest-nolsm"]);
        assert!(
            PINS.iter()
                .all(|pin| pin.cmdline.is_empty() || pin.only_named.is_some()),
            "a kernel booted with words of its own is run only when named"
        );
    }

    #[test]
    fn the_kernel_is_found_in_either_layout_of_debians_packages() {
        let old = "\
drwxr-xr-x root/root         0 2026-04-01 10:00 ./boot/
-rw-r--r-- root/root    260000 2026-04-01 10:00 ./boot/config-6.1.0-57-cloud-amd64
-rw-r--r-- root/root   7000000 2026-04-01 10:00 ./boot/vmlinuz-6.1.0-57-cloud-amd64
-rw-r--r-- root/root     83000 2026-04-01 10:00 ./boot/System.map-6.1.0-57-cloud-amd64
-rw-r--r-- root/root     10000 2026-04-01 10:00 ./usr/lib/modules/6.1.0-57-cloud-amd64/kernel/x.ko
";
        let members = kernel_members(old);
        assert_eq!(members.len(), 2, "{members:?}");
        assert!(members.iter().all(|m| m.release == "6.1.0-57-cloud-amd64"));
        assert!(
            members
                .iter()
                .any(|m| m.kernel && m.path == "./boot/vmlinuz-6.1.0-57-cloud-amd64")
        );
        let new = "\
drwxr-xr-x root/root         0 2026-10-16 02:51 ./usr/lib/modules/7.3-cloud-amd64/
-rw-r--r-- root/root  14194624 2026-10-16 02:51 ./usr/lib/modules/7.3-cloud-amd64/vmlinuz
lrwxrwxrwx root/root         0 2026-10-16 02:51 ./usr/lib/modules/7.3-cloud-amd64/build -> x
";
        assert_eq!(
            kernel_members(new),
            [Member {
                path: "./usr/lib/modules/7.3-cloud-amd64/vmlinuz".into(),
                release: "7.3-cloud-amd64".into(),
                kernel: true
            }]
        );
    }

    #[test]
    fn every_kernel_is_of_its_arch() {
        for pin in &PINS {
            let flavour = format!("-cloud-{}", pin.arch.debian());
            assert!(pin.meta.ends_with(&flavour), "{}", pin.name);
            if let Choice::Pinned { package, .. } = pin.choice {
                assert!(package.ends_with(&flavour), "{}", pin.name);
            }
        }
    }
}
