//! `cargo xtask systemtest`: the Debian package under a real systemd. A Debian 12 userland with
//! systemd (debootstrap, cached) is the whole root of a guest booted under QEMU on bookworm's
//! kernel, as an initramfs (the cloud kernels' disk drivers are modules; an initramfs needs
//! none), with systemd as PID 1. Its test unit installs the package, upgrades it to a second
//! version while a tree runs, SIGKILLs the daemon, scores the unit, reads the journal, removes
//! and purges the package (guest.sh), and powers off; the host reads the console.

use std::{
    fs,
    ops::ControlFlow,
    os::unix::fs::{PermissionsExt, symlink},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    apt_install,
    cross::Arch,
    dist::{Staged, deb},
    output, status, userland, vmtest, workspace_root,
};

/// The kernel the guest boots: bookworm's own, as a Debian 12 machine runs.
const KERNEL: &str = "bookworm-6.1";

const GUEST_SCRIPT: &str = include_str!("guest.sh");
const GUEST_UNIT: &str = "[Unit]
Description=leash's system test
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/leash-systemtest
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0

[Install]
WantedBy=multi-user.target
";

/// What the guest's lines start with; see guest.sh.
const MARKER: &str = "SYSTEMTEST ";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// kvm, tcg, or auto: KVM when a short probe boot works, TCG (emulation) otherwise.
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    accel: String,
    /// How long the guest may take, in seconds, before its machine is stopped.
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    timeout: u64,
}

pub(crate) fn systemtest(options: &Options) -> Result<()> {
    vmtest::ensure_tools()?;
    if !Path::new("/usr/bin/cpio").is_file() {
        apt_install(&["cpio"], false)?;
    }
    let out = workspace_root().join("target/systemtest");
    fs::create_dir_all(&out).with_context(|| format!("making {}", out.display()))?;
    // The binary `cargo xtask dist` staged, packaged twice: the upgrade changes nothing but
    // the version.
    let staged = Staged::existing(Arch::X86_64)?;
    let version_b = format!("{}+systemtest1", staged.version);
    let deb_a = deb::package(&staged, &staged.version, &out)?;
    let deb_b = deb::package(&staged, &version_b, &out)?;
    let version_c = format!("{}+systemtest2", staged.version);
    let deb_c = with_other_abi(&deb_b, &version_c, &out)?;
    let max_exposure = offline_exposure(&deb_a, &out)?;

    let kernel = vmtest::kernel(KERNEL)?;
    let root = out.join("root");
    userland::BOOKWORM_SYSTEMD.unpack(&root)?;
    for deb in [&deb_a, &deb_b, &deb_c] {
        let name = deb.file_name().context("a package without a name")?;
        fs::copy(deb, root.join("root").join(name))
            .with_context(|| format!("copying {}", deb.display()))?;
    }
    let env = format!(
        "DEB_A={}\nDEB_B={}\nVERSION_B={version_b}\nDEB_C={}\nMAX_EXPOSURE={max_exposure}\n",
        file_name(&deb_a),
        file_name(&deb_b),
        file_name(&deb_c),
    );
    write(&root.join("root/systemtest.env"), &env, 0o644)?;
    write(
        &root.join("usr/local/sbin/leash-systemtest"),
        GUEST_SCRIPT,
        0o755,
    )?;
    let unit = "etc/systemd/system/leash-systemtest.service";
    write(&root.join(unit), GUEST_UNIT, 0o644)?;
    let wants = root.join("etc/systemd/system/multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    symlink(format!("/{unit}"), wants.join("leash-systemtest.service"))?;
    // The kernel runs an initramfs's /init.
    symlink("/lib/systemd/systemd", root.join("init"))?;
    let initrd = out.join("root.cpio");
    pack(&root, &initrd)?;
    fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;

    let accel = vmtest::accelerator(&options.accel, &kernel.vmlinuz, &out)?;
    let log_path = out.join("console.log");
    let mut log = Vec::new();
    let mut ended = None;
    let started = Instant::now();
    eprintln!(
        "xtask: booting {} ({accel}) with systemd; the console goes to {}",
        kernel.name,
        log_path.display()
    );
    let ending = vmtest::boot(
        accel,
        &kernel.vmlinuz,
        &initrd,
        Duration::from_secs(options.timeout),
        |line| {
            log.push(line.to_owned());
            let Some(said) = line.find(MARKER).map(|at| &line[at + MARKER.len()..]) else {
                return ControlFlow::Continue(());
            };
            println!("{said}");
            match said.strip_prefix("END ") {
                Some(verdict) => {
                    ended = Some(verdict.trim() == "pass");
                    ControlFlow::Break(())
                }
                None => ControlFlow::Continue(()),
            }
        },
    )?;
    fs::write(&log_path, log.join("\n") + "\n")
        .with_context(|| format!("writing {}", log_path.display()))?;
    let elapsed = started.elapsed();
    match ended {
        Some(true) => {
            println!("systemtest: passed in {elapsed:.0?}");
            Ok(())
        }
        Some(false) => bail!(
            "the system test failed after {elapsed:.0?}; the console: {}",
            log_path.display()
        ),
        None => bail!(
            "the guest never finished ({ending:?}, after {elapsed:.0?}); the console: {}",
            log_path.display()
        ),
    }
}

/// `deb` as a release whose pins have another ABI would be: its preinst expects the next ABI
/// (the files are the same, so only the preinst's refusal is tested), under `version`.
fn with_other_abi(deb: &Path, version: &str, out: &Path) -> Result<std::path::PathBuf> {
    let tree = out.join("other-abi");
    let _ = fs::remove_dir_all(&tree);
    status(
        Command::new("dpkg-deb")
            .arg("--raw-extract")
            .arg(deb)
            .arg(&tree),
    )?;
    let edit = |file: &str, change: &dyn Fn(&str) -> Option<String>| -> Result<()> {
        let path = tree.join("DEBIAN").join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {file}"))?;
        let mut changed = false;
        let text: String = text
            .lines()
            .map(|line| {
                let new = change(line);
                changed |= new.is_some();
                new.unwrap_or_else(|| line.to_owned()) + "\n"
            })
            .collect();
        if !changed {
            bail!("nothing to change in the package's {file}");
        }
        fs::write(&path, text)?;
        Ok(())
    };
    edit("control", &|line| {
        line.starts_with("Version:")
            .then(|| format!("Version: {version}"))
    })?;
    edit("preinst", &|line| {
        let abi: u32 = line.strip_prefix("NEW_ABI=")?.parse().ok()?;
        Some(format!("NEW_ABI={}", abi + 1))
    })?;
    let repackaged = out.join(format!("leash_{version}_amd64.deb"));
    status(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&tree)
            .arg(&repackaged),
    )?;
    fs::remove_dir_all(&tree)?;
    Ok(repackaged)
}

/// The exposure `systemd-analyze security --offline=yes` gives the package's unit here: the
/// guest's systemd (the same Debian 12's) must score it as well or better.
fn offline_exposure(deb: &Path, out: &Path) -> Result<String> {
    let tree = out.join("unit");
    let _ = fs::remove_dir_all(&tree);
    status(
        Command::new("dpkg-deb")
            .arg("--extract")
            .arg(deb)
            .arg(&tree),
    )?;
    let unit = ["lib/systemd/system", "usr/lib/systemd/system"]
        .iter()
        .map(|dir| tree.join(dir).join("leash.service"))
        .find(|path| path.is_file())
        .context("the package holds no leash.service")?;
    let report = output(
        Command::new("systemd-analyze")
            .args(["security", "--offline=yes", "--no-pager"])
            .arg(&unit),
    )?;
    fs::remove_dir_all(&tree)?;
    let score = report
        .lines()
        .find_map(|line| line.split("Overall exposure level for ").nth(1))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .with_context(|| format!("no score in systemd-analyze security's report:\n{report}"))?;
    eprintln!("xtask: systemd-analyze security --offline=yes on the package's unit: {score}");
    Ok(score.to_owned())
}

/// `root` as an initramfs: cpio's newc, with every owner, mode and device node as they are.
fn pack(root: &Path, to: &Path) -> Result<()> {
    let archive = fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let listing = Command::new("find")
        .args([".", "-print0"])
        .current_dir(root)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running find")?;
    status(
        Command::new("cpio")
            .args(["--null", "--create", "--quiet", "--format=newc"])
            .current_dir(root)
            .stdin(listing.stdout.context("find's output")?)
            .stdout(archive),
    )?;
    eprintln!(
        "xtask: the guest's root: {} MB",
        fs::metadata(to)?.len() / 1_000_000
    );
    Ok(())
}

fn write(path: &Path, content: &str, mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}
