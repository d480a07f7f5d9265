//! The staged binary, and the package, in the Debian userlands it must run in: Debian 11
//! (bullseye, glibc 2.31, the floor) and Debian 13 (trixie), minimal roots made and cached by
//! [`crate::userland`] and unpacked afresh for every run.
//!
//! Each runs as a chroot in a mount namespace of its own (`unshare --mount --propagation
//! private`, with the machine's /proc, /sys, /sys/fs/bpf and /dev bound in), held by one
//! process; every command of the check enters it (`nsenter`, `chroot`). The kernel, the pid
//! namespace and bpffs are the machine's: the daemon in the chroot loads its programs into
//! this kernel and pins them under a directory of its own.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::Staged;
use crate::{
    is_root, output, poll, status,
    userland::{self, Userland},
};

/// The userlands, oldest first.
const USERLANDS: [&Userland; 2] = [&userland::BULLSEYE, &userland::TRIXIE];

/// Where the binary goes in a userland, and the daemon's socket there.
const BINARY: &str = "/usr/local/bin/leash";
const SOCKET: &str = "/run/leash-dist-test/leash.sock";

/// The packages `cargo xtask deb --check` installs: the package, then the same binary under
/// a newer version (an upgrade).
pub(crate) struct Packages<'a> {
    pub first: &'a Path,
    pub upgrade: &'a Path,
}

/// Runs the checks in every userland, printing PASS or FAIL and the time for each; fails if
/// any failed.
pub(crate) fn check(staged: &Staged, packages: Option<&Packages>) -> Result<()> {
    if !is_root() {
        bail!("the userland checks need root (chroot, mount namespaces, BPF)");
    }
    let mut failed = Vec::new();
    for userland in USERLANDS {
        let suite = userland.suite;
        let start = Instant::now();
        let result = check_suite(userland, staged, packages);
        let seconds = start.elapsed().as_secs_f64();
        match result {
            Ok(()) => println!("userland {suite}: PASS ({seconds:.1} s)"),
            Err(e) => {
                println!("userland {suite}: FAIL ({seconds:.1} s): {e:#}");
                failed.push(suite);
            }
        }
    }
    if !failed.is_empty() {
        bail!("failed in {}", failed.join(", "));
    }
    Ok(())
}

fn check_suite(userland: &Userland, staged: &Staged, packages: Option<&Packages>) -> Result<()> {
    let suite = userland.suite;
    let tarball = userland.tarball()?;
    let chroot = Chroot::unpack(suite, &tarball)?;
    let binary = chroot.host_path(BINARY);
    fs::create_dir_all(binary.parent().context("a directory")?)?;
    fs::copy(staged.binary(), &binary)?;

    let version = output(&mut chroot.command(BINARY, &["--version"]))?;
    eprintln!("xtask: {suite}: {}", version.trim());
    leash_run_host_killed(&chroot)?;
    if let Some(packages) = packages {
        install_upgrade_purge(&chroot, packages)?;
    }
    Ok(())
}

/// A daemon; `leash run -- sleep 600`; the `leash run` process SIGKILLed: the `sleep` must
/// die. Then the daemon stops (SIGTERM) and must remove its pins.
fn leash_run_host_killed(chroot: &Chroot) -> Result<()> {
    let pins = format!(
        "/sys/fs/bpf/leash-test-{}-dist-{}",
        std::process::id(),
        chroot.suite
    );
    let mut processes = Processes::new(Path::new(&pins));
    fs::create_dir_all(chroot.host_path(SOCKET).parent().context("a directory")?)?;
    let log = chroot.host_path("/var/log/leash-daemon.log");
    let log_file = fs::File::create(&log)?;
    let daemon = chroot
        .command(BINARY, &["daemon", "--socket", SOCKET, "--pin-dir", &pins])
        .env("LEASH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .context("starting the daemon")?;
    let daemon = processes.add(daemon);
    let daemon_log = || fs::read_to_string(&log).unwrap_or_default();

    poll(Duration::from_secs(60), "the daemon to serve", || {
        let serves = chroot
            .command(BINARY, &["--socket", SOCKET, "status"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if serves {
            return Ok(Some(()));
        }
        if let Some(exit) = processes.get(daemon).try_wait()? {
            bail!("the daemon exited ({exit})");
        }
        Ok(None)
    })
    .with_context(daemon_log)?;

    let host = chroot
        .command(
            BINARY,
            &["--socket", SOCKET, "run", "--", "/bin/sleep", "600"],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting leash run")?;
    let host_pid = host.id();
    let host = processes.add(host);
    let sleep = poll(
        Duration::from_secs(30),
        "the leashed sleep to start",
        || {
            Ok(children(host_pid)
                .into_iter()
                .find(|&pid| comm(pid).as_deref() == Some("sleep")))
        },
    )?;
    processes.stray = Some(sleep);
    processes.get(host).kill()?;
    processes.get(host).wait()?;
    poll(
        Duration::from_secs(30),
        "the sleep to die with its host",
        || Ok((comm(sleep).as_deref() != Some("sleep")).then_some(())),
    )
    .with_context(|| format!("daemon log:\n{}", daemon_log()))?;
    processes.stray = None;

    crate::status(Command::new("kill").args(["-TERM", &processes.get(daemon).id().to_string()]))?;
    let exit = poll(Duration::from_secs(150), "the daemon to stop", || {
        Ok(processes.get(daemon).try_wait()?)
    })?;
    if !exit.success() {
        bail!("the daemon exited with {exit}:\n{}", daemon_log());
    }
    // The daemon removes what it pinned, and leaves the directory it was given.
    let left: Vec<_> = fs::read_dir(&pins)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    if !left.is_empty() {
        bail!("the daemon left pins: {left:?}");
    }
    Ok(())
}

/// `dpkg -i` the package, run it, `dpkg -i` the newer version over it, `dpkg --purge` it:
/// with no systemd running, the scripts must skip systemctl, and nothing may be left.
fn install_upgrade_purge(chroot: &Chroot, packages: &Packages) -> Result<()> {
    // The scripts read and remove /sys/fs/bpf/leash: the machine's must not be touched.
    chroot.hide_bpffs()?;
    let files = package_files(packages.first)?;
    let before = chroot.listing()?;
    for (deb, what) in [(packages.first, "install"), (packages.upgrade, "upgrade")] {
        let inside = format!(
            "/tmp/{}",
            deb.file_name().context("a name")?.to_string_lossy()
        );
        fs::copy(deb, chroot.host_path(&inside))?;
        let out = chroot
            .command("/usr/bin/dpkg", &["-i", &inside])
            .output()
            .context("running dpkg")?;
        if !out.status.success() {
            bail!(
                "dpkg -i ({what}) failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fs::remove_file(chroot.host_path(&inside))?;
        for file in &files {
            if !chroot.host_path(file).exists() {
                bail!("after the {what}, {file} is missing");
            }
        }
        output(&mut chroot.command("/usr/bin/leash", &["--version"]))?;
    }
    status(&mut chroot.command("/usr/bin/dpkg", &["--purge", "leash"]))?;
    let after = chroot.listing()?;
    let left: Vec<&String> = after.iter().filter(|p| !before.contains(p)).collect();
    if !left.is_empty() {
        bail!("the purge left {left:?}");
    }
    eprintln!(
        "xtask: {}: installed, upgraded and purged the package ({} files), nothing left",
        chroot.suite,
        files.len()
    );
    Ok(())
}

/// The files (not directories) a package holds, as absolute paths.
fn package_files(deb: &Path) -> Result<Vec<String>> {
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(deb))?;
    Ok(listing
        .lines()
        .filter(|line| !line.starts_with('d'))
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(|path| path.trim_start_matches('.').to_owned())
        .collect())
}

/// A userland unpacked into a temporary directory, made the root of a private mount namespace
/// held by one process (`cat`, which ends when its input closes). Dropping it ends the
/// namespace, and its mounts with it, and removes the directory.
struct Chroot {
    suite: String,
    dir: PathBuf,
    holder: Child,
    holder_input: Option<ChildStdin>,
}

impl Chroot {
    fn unpack(suite: &str, tarball: &Path) -> Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("leash-userland-{suite}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        // Removed again if anything below fails.
        let remove = RemoveOnDrop(dir.clone());
        status(
            Command::new("tar")
                .arg("-C")
                .arg(&dir)
                .arg("-xf")
                .arg(tarball),
        )?;
        // The userlands keep dpkg from installing documentation (userland.rs, EXCLUDED): the
        // package is checked whole, as a user's machine installs it.
        let configs = dir.join("etc/dpkg/dpkg.cfg.d");
        for config in fs::read_dir(&configs).into_iter().flatten().flatten() {
            let text = fs::read_to_string(config.path())?;
            let kept: String = text
                .lines()
                .filter(|line| !line.starts_with("path-exclude"))
                .map(|line| format!("{line}\n"))
                .collect();
            fs::write(config.path(), kept)?;
        }
        let script = r#"set -e
for fs in proc sys dev; do mount --rbind "/$fs" "$1/$fs"; done
mountpoint -q "$1/sys/fs/bpf" || mount --bind /sys/fs/bpf "$1/sys/fs/bpf"
echo ready
exec cat >/dev/null"#;
        let mut holder = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting unshare")?;
        let holder_input = holder.stdin.take();
        let mut line = String::new();
        BufReader::new(holder.stdout.take().context("unshare's output")?).read_line(&mut line)?;
        std::mem::forget(remove);
        let chroot = Self {
            suite: suite.to_owned(),
            dir,
            holder,
            holder_input,
        };
        if line.trim() != "ready" {
            bail!("could not mount /proc, /sys and /dev in the {suite} userland");
        }
        Ok(chroot)
    }

    /// `path` of the userland, as the machine sees it.
    fn host_path(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }

    /// `program args...` in the userland (absolute `program`, as the userland sees it).
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .arg("chroot")
            .arg(&self.dir)
            .arg(program)
            .args(args)
            .env(
                "PATH",
                "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
            )
            .env_remove("LEASH_SOCKET");
        command
    }

    /// Mounts an empty tmpfs over the userland's /sys/fs/bpf.
    fn hide_bpffs(&self) -> Result<()> {
        status(
            Command::new("nsenter")
                .arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
                .args(["mount", "-t", "tmpfs", "leash-check"])
                .arg(self.host_path("/sys/fs/bpf")),
        )
    }

    /// Every path of the userland but the mounted and scratch ones.
    fn listing(&self) -> Result<Vec<String>> {
        let listing = output(
            self.command("/usr/bin/find", &["/", "-xdev"])
                .env("LC_ALL", "C"),
        )?;
        Ok(listing
            .lines()
            .filter(|p| !p.starts_with("/tmp/") && !p.starts_with("/var/log/"))
            .filter(|p| !p.starts_with("/var/cache/debconf/") && !p.starts_with("/var/lib/dpkg/"))
            .map(str::to_owned)
            .collect())
    }
}

impl Drop for Chroot {
    fn drop(&mut self) {
        drop(self.holder_input.take());
        if poll(Duration::from_secs(10), "unshare to end", || {
            Ok(self.holder.try_wait()?.map(|_| ()))
        })
        .is_err()
        {
            let _ = self.holder.kill();
            let _ = self.holder.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The processes a check started, SIGKILLed and reaped when it ends (a passing check has
/// ended them all already), with the sleep that must not outlive its host, and the daemon's
/// pins, removed if a killed daemon left them.
struct Processes {
    children: Vec<Child>,
    stray: Option<u32>,
    pins: PathBuf,
}

impl Processes {
    fn new(pins: &Path) -> Self {
        Self {
            children: Vec::new(),
            stray: None,
            pins: pins.to_path_buf(),
        }
    }

    fn add(&mut self, child: Child) -> usize {
        self.children.push(child);
        self.children.len() - 1
    }

    fn get(&mut self, index: usize) -> &mut Child {
        &mut self.children[index]
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.children {
            if child.try_wait().is_ok_and(|exit| exit.is_none()) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Some(pid) = self.stray
            && comm(pid).as_deref() == Some("sleep")
        {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let _ = fs::remove_dir_all(&self.pins);
    }
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The command name of a live process (`None` once it is gone or a zombie).
fn comm(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
    (!rest.starts_with('Z')).then(|| name.to_owned())
}
