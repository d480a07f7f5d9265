//! `cargo xtask image [--check]`: the image of dist/Containerfile, built and run by a real
//! engine (podman, installed with apt when missing).
//!
//! The build stage's base image is not needed: the files it would hand the runtime stage (the
//! binary, and the C libraries `ldd` names, at their paths, as its last RUN collects them) are
//! staged on this machine in a directory laid out as the build stage's file system, and
//! `podman build --build-context build=DIR` builds the runtime stage of dist/Containerfile
//! itself from it: a named build context replaces the stage of the same name, which is then
//! never built. The image is tagged localhost/leash:VERSION and kept (the next build replaces it).
//!
//! `--check` then runs it as the DaemonSet (dist/kubernetes/leash-daemonset.yaml) runs it,
//! translated to podman's flags ([`DAEMONSET`]), on a socket directory and a pins directory of
//! its own, and checks that a tree started on this machine is enforced by the daemon in the
//! container, that stopping the container (the image's STOPSIGNAL, SIGHUP) hands the tree
//! over, and that a second container takes it over. Whatever it started is removed afterwards,
//! whether the checks passed or not.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{apt_install, cargo, output, poll, setup, status, workspace_root};

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Also run the image as the DaemonSet does and check enforcement, hand-over and
    /// take-over against trees started on this machine.
    #[arg(long)]
    check: bool,
    /// The leash binary to put in the image; without it, `cargo build --release` builds one
    /// (as the build stage does).
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
}

/// The image's name: the workspace's version, as dist/Containerfile labels it.
const TAG: &str = concat!("localhost/leash:", env!("CARGO_PKG_VERSION"));

/// Where the binary is in the build stage (its WORKDIR and cargo's output), for the runtime
/// stage's `COPY --from=build`.
const BUILD_STAGE_BINARY: &str = "src/target/release/leash";

/// The DaemonSet's settings and podman's flags for each: the manifest's lines (trimmed, in
/// order, comments left out) and the flags that do the same. A unit test checks that the
/// manifest still says each; docs/DEPLOY.md has the same table.
const DAEMONSET: &[(&[&str], &[&str])] = &[
    (&["hostPID: true"], &["--pid=host"]),
    (&["hostUsers: true"], &["--userns=host"]),
    (&["runAsUser: 0", "runAsGroup: 0"], &["--user=0:0"]),
    // Not --privileged.
    (&["privileged: false"], &[]),
    (&["capabilities:", "drop: [\"ALL\"]"], &["--cap-drop=ALL"]),
    (
        &["add: [\"BPF\", \"PERFMON\", \"SYS_ADMIN\", \"KILL\"]"],
        &["--cap-add=BPF,PERFMON,SYS_ADMIN,KILL"],
    ),
    (
        &["allowPrivilegeEscalation: false"],
        &["--security-opt=no-new-privileges"],
    ),
    // Kubernetes mounts no tmpfs on /tmp, /run and /var/tmp as podman's --read-only would.
    (
        &["readOnlyRootFilesystem: true"],
        &["--read-only", "--read-only-tmpfs=false"],
    ),
    (
        &["seccompProfile:", "type: Unconfined"],
        &["--security-opt=seccomp=unconfined"],
    ),
    (
        &["appArmorProfile:", "type: Unconfined"],
        &["--security-opt=apparmor=unconfined"],
    ),
    (
        &["- name: LEASH_LOG", "value: info"],
        &["--env=LEASH_LOG=info"],
    ),
    // How long `podman stop` waits before SIGKILL.
    (
        &["terminationGracePeriodSeconds: 120"],
        &["--stop-timeout=120"],
    ),
    (&["limits:", "memory: 512Mi"], &["--memory=512m"]),
    (&["imagePullPolicy: IfNotPresent"], &["--pull=missing"]),
    (
        &["- name: bpffs", "mountPath: /sys/fs/bpf"],
        &["--volume=/sys/fs/bpf:/sys/fs/bpf"],
    ),
    // The node's /run/leash; the check's own directory instead.
    (
        &["- name: socket-dir", "mountPath: /run/leash"],
        &["--volume={socket_dir}:/run/leash"],
    ),
];

/// The DaemonSet's args, after the image's ENTRYPOINT; the pins directory is the check's own.
const DAEMON_ARGS: &[&str] = &[
    "--socket",
    "/run/leash/leash.sock",
    "--pin-dir",
    "{pins}",
    "--metrics",
    "/run/leash/metrics.sock",
];

/// What each check's names start with: containers `PREFIX-PID-N`, the socket directory
/// /tmp/PREFIX-PID, the pins /sys/fs/bpf/PREFIX-PID (PID: the xtask's).
const PREFIX: &str = "leash-image";

/// How long a daemon may take to serve, and a tree to die.
const START_DEADLINE: Duration = Duration::from_secs(30);
const KILL_DEADLINE: Duration = Duration::from_secs(10);

pub(crate) fn image(options: &Options) -> Result<()> {
    let started = Instant::now();
    if !crate::is_root() {
        bail!("run it as root: a rootless podman cannot load BPF programs");
    }
    ensure_podman()?;
    let binary = match &options.binary {
        Some(binary) => binary.clone(),
        None => {
            setup()?;
            cargo(&["build", "--release", "--locked", "--package", "leash-user"])?;
            workspace_root().join("target/release/leash")
        }
    };
    // Before the build: a stale container would keep the image it replaces.
    remove_stale();
    let at = Instant::now();
    build(&binary)?;
    let size =
        output(Command::new("podman").args(["image", "inspect", "--format", "{{.Size}}", TAG]))?;
    let size: u64 = size.trim().parse().context("the image's size")?;
    println!(
        "built {TAG}: {:.1} MB, in {:.1}s",
        size as f64 / 1e6,
        at.elapsed().as_secs_f64()
    );
    if options.check {
        check(&binary)?;
    }
    println!("image: done in {:.1}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Installs podman with apt if it is missing.
fn ensure_podman() -> Result<()> {
    if output(Command::new("podman").arg("--version")).is_ok() {
        return Ok(());
    }
    let at = Instant::now();
    apt_install(&["podman"], true)?;
    eprintln!(
        "xtask: podman installed in {:.0}s",
        at.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Stages what the build stage hands the runtime stage and builds the runtime stage from it.
fn build(binary: &Path) -> Result<()> {
    let containerfile = workspace_root().join("dist/Containerfile");
    let text = fs::read_to_string(&containerfile)
        .with_context(|| format!("reading {}", containerfile.display()))?;
    let collect = build_stage_last_run(&text)?;

    let context = workspace_root().join("target/image");
    if context.exists() {
        fs::remove_dir_all(&context).with_context(|| format!("removing {}", context.display()))?;
    }
    let staged = context.join("build").join(BUILD_STAGE_BINARY);
    fs::create_dir_all(staged.parent().context("a directory")?)?;
    fs::copy(binary, &staged).with_context(|| format!("copying {}", binary.display()))?;
    // The build stage's last RUN, on this machine: it collects the libraries into /runtime,
    // here the staged directory's runtime/.
    let runtime = context.join("build/runtime");
    let collect = collect.replace("/runtime", &runtime.display().to_string());
    status(
        Command::new("bash")
            .args(["-o", "pipefail", "-c", &collect])
            .current_dir(context.join("build/src")),
    )
    .context("collecting the binary's libraries as the build stage does")?;
    // The main context: the build stage's `COPY . .`, which is never built.
    let unused = context.join("unused");
    fs::create_dir_all(&unused)?;

    let previous = image_id(TAG);
    status(
        Command::new("podman")
            .args(["build", "--quiet", "--pull=never", "--layers=false"])
            .arg(format!(
                "--build-context=build={}",
                context.join("build").display()
            ))
            .arg("--file")
            .arg(&containerfile)
            .args(["--tag", TAG])
            .arg(&unused)
            .stdout(Stdio::null()),
    )
    .context("building the image")?;
    // The image this one replaced keeps no name: remove it, unless a container still uses it.
    if let Some(previous) = previous.filter(|id| image_id(TAG).as_ref() != Some(id)) {
        let _ = output(Command::new("podman").args(["rmi", &previous]));
    }
    Ok(())
}

/// The build stage's last RUN (the one that collects the C libraries), continued lines joined.
fn build_stage_last_run(containerfile: &str) -> Result<String> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in containerfile.lines().map(str::trim) {
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(continued) => current.push_str(continued),
            None => {
                current.push_str(line);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let stage = instructions
        .iter()
        .position(|i| i.starts_with("FROM ") && i.ends_with(" AS build"))
        .context("dist/Containerfile has no stage named build")?;
    let end = instructions[stage + 1..]
        .iter()
        .position(|i| i.starts_with("FROM "))
        .map_or(instructions.len(), |at| stage + 1 + at);
    let run = instructions[stage..end]
        .iter()
        .rev()
        .find_map(|i| i.strip_prefix("RUN "))
        .context("the build stage has no RUN")?;
    if !run.contains("/runtime") || !run.contains("target/release/leash") {
        bail!(
            "the build stage's last RUN no longer collects target/release/leash's libraries into /runtime: {run}"
        );
    }
    Ok(run.to_owned())
}

fn image_id(name: &str) -> Option<String> {
    output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", name]))
        .ok()
        .map(|id| id.trim().to_owned())
}

/// Runs the checks, printing PASS or FAIL and the time taken for each; stops at the first
/// failure. Removes whatever they started, whatever the outcome.
fn check(binary: &Path) -> Result<()> {
    let mut run = Run::new(binary)?;
    let outcome = run.checks();
    if outcome.is_err() {
        for name in &run.containers {
            // The daemon logs to its stderr, which podman logs passes on as its own.
            if let Ok(log) = Command::new("podman").args(["logs", name]).output() {
                eprintln!(
                    "--- {name}'s log:\n{}{}",
                    String::from_utf8_lossy(&log.stdout),
                    String::from_utf8_lossy(&log.stderr)
                );
            }
        }
    }
    drop(run);
    outcome
}

/// One check's state: its directories, containers and processes, removed when dropped.
struct Run {
    binary: PathBuf,
    socket_dir: PathBuf,
    pins: PathBuf,
    /// podman's flags beyond the DaemonSet's, where this machine needs them.
    machine_flags: Vec<String>,
    containers: Vec<String>,
    /// `leash run` processes, and the trees' members (pid and start time).
    hosts: Vec<Child>,
    members: Vec<(u32, u64)>,
}

impl Run {
    fn new(binary: &Path) -> Result<Self> {
        let name = format!("{PREFIX}-{}", std::process::id());
        let socket_dir = Path::new("/tmp").join(&name);
        fs::create_dir_all(&socket_dir)?;
        // The daemon requires its socket's directory to be root's and not writable by others;
        // every client must reach it.
        fs::set_permissions(&socket_dir, fs::Permissions::from_mode(0o755))?;
        Ok(Self {
            binary: binary.to_owned(),
            socket_dir,
            pins: Path::new("/sys/fs/bpf").join(&name),
            machine_flags: machine_flags()?,
            containers: Vec::new(),
            hosts: Vec::new(),
            members: Vec::new(),
        })
    }

    fn checks(&mut self) -> Result<()> {
        if !self.machine_flags.is_empty() {
            println!(
                "podman flags for this machine: {}",
                self.machine_flags.join(" ")
            );
        }
        let first = timed("the daemon in a container serves", || {
            self.start_container()
        })?;

        timed(
            "a tree on this machine is enforced (its leash run SIGKILLed)",
            || {
                let (host, members) = self.start_tree()?;
                self.kill_host(host)?;
                self.await_gone(&members)
            },
        )?;

        let (host, members) = timed(
            "podman stop hands over (the tree outlives the daemon)",
            || {
                let tree = self.start_tree()?;
                status(
                    Command::new("podman")
                        .args(["stop", &first])
                        .stdout(Stdio::null()),
                )?;
                let state = output(Command::new("podman").args([
                    "inspect",
                    "--format",
                    "{{.State.Status}} {{.State.ExitCode}}",
                    &first,
                ]))?;
                if state.trim() != "exited 0" {
                    bail!("the stopped container is {}, not exited 0", state.trim());
                }
                let gone: Vec<_> = tree.1.iter().filter(|m| !alive(**m)).collect();
                if !gone.is_empty() || !alive_child(&mut self.hosts[tree.0]) {
                    bail!("the tree did not outlive the daemon (dead members: {gone:?})");
                }
                Ok(tree)
            },
        )?;

        timed(
            "a second container takes over (the tree dies with its host)",
            || {
                self.start_container()?;
                let pid = self.hosts[host].id();
                poll(
                    START_DEADLINE,
                    "the second daemon to list the tree with its two sleeps",
                    || {
                        let sleeps = self.tree_members(pid)?;
                        Ok(sleeps.is_some_and(|sleeps| sleeps.len() == 2).then_some(()))
                    },
                )?;
                self.kill_host(host)?;
                self.await_gone(&members)
            },
        )?;
        Ok(())
    }

    /// Starts the next container and waits until its daemon answers `leash status` (the
    /// DaemonSet's readiness probe); returns its name.
    fn start_container(&mut self) -> Result<String> {
        let name = format!(
            "{PREFIX}-{}-{}",
            std::process::id(),
            self.containers.len() + 1
        );
        let socket_dir = self.socket_dir.display().to_string();
        let pins = self.pins.display().to_string();
        let mut run = Command::new("podman");
        run.args(["run", "--detach", "--name", &name]);
        for (_, flags) in DAEMONSET {
            run.args(flags.iter().map(|f| f.replace("{socket_dir}", &socket_dir)));
        }
        run.arg("--network=none")
            .args(&self.machine_flags)
            .arg(TAG)
            .args(DAEMON_ARGS.iter().map(|a| a.replace("{pins}", &pins)));
        self.containers.push(name.clone());
        status(run.stdout(Stdio::null()))?;
        poll(START_DEADLINE, &format!("{name}'s daemon to serve"), || {
            let probe = Command::new("podman")
                .args(["exec", &name, "/usr/local/bin/leash", "status"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()?;
            if probe.success() {
                return Ok(Some(()));
            }
            let state = output(Command::new("podman").args([
                "inspect",
                "--format",
                "{{.State.Status}}",
                &name,
            ]))?;
            if state.trim() != "running" {
                bail!("{name} is {}", state.trim());
            }
            Ok(None)
        })?;
        Ok(name)
    }

    /// Starts `leash run -- sh -c 'setsid sleep 3001 & exec sleep 3002'` on this machine and
    /// waits until the daemon lists its two members; returns the host's index and the members.
    fn start_tree(&mut self) -> Result<(usize, Vec<(u32, u64)>)> {
        let host = Command::new(&self.binary)
            .arg("run")
            .arg("--socket")
            .arg(self.socket_dir.join("leash.sock"))
            .args(["--", "sh", "-c", "setsid sleep 3001 & exec sleep 3002"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("starting leash run")?;
        let pid = host.id();
        self.hosts.push(host);
        let index = self.hosts.len() - 1;
        let members = poll(
            START_DEADLINE,
            &format!("the tree of leash run {pid} to get its two sleeps"),
            || {
                if let Some(members) = self.tree_members(pid)?
                    && members.len() == 2
                {
                    let members: Vec<(u32, u64)> = members
                        .iter()
                        .filter_map(|&pid| Some((pid, start_time(pid)?)))
                        .collect();
                    self.members.extend(&members);
                    if members.len() == 2 {
                        return Ok(Some(members));
                    }
                }
                if !alive_child(&mut self.hosts[index]) {
                    bail!("leash run exited");
                }
                Ok(None)
            },
        )?;
        Ok((index, members))
    }

    /// The sleeps of the tree `host` holds, as `leash ls` lists them; None if none is listed.
    fn tree_members(&self, host: u32) -> Result<Option<Vec<u32>>> {
        let json = output(
            Command::new(&self.binary)
                .arg("ls")
                .arg("--json")
                .arg("--socket")
                .arg(self.socket_dir.join("leash.sock")),
        )?;
        let trees: serde_json::Value = serde_json::from_str(&json).context("leash ls --json")?;
        let Some(tree) = trees
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["host_pid"] == host)
        else {
            return Ok(None);
        };
        let sleeps = tree["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["comm"] == "sleep")
            .filter_map(|m| m["pid"].as_u64().and_then(|p| u32::try_from(p).ok()))
            .collect();
        Ok(Some(sleeps))
    }

    fn kill_host(&mut self, host: usize) -> Result<()> {
        self.hosts[host].kill().context("SIGKILLing leash run")?;
        self.hosts[host].wait()?;
        Ok(())
    }

    fn await_gone(&self, members: &[(u32, u64)]) -> Result<()> {
        poll(
            KILL_DEADLINE,
            "the tree's members to die with their host",
            || Ok(members.iter().all(|m| !alive(*m)).then_some(())),
        )
        .with_context(|| {
            let left: Vec<_> = members.iter().filter(|m| alive(**m)).map(|m| m.0).collect();
            format!("still running: {left:?}")
        })
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            let _ = host.kill();
            let _ = host.wait();
        }
        for &member in &self.members {
            if alive(member) {
                let _ = Command::new("kill")
                    .arg("-KILL")
                    .arg(member.0.to_string())
                    .status();
            }
        }
        if !self.containers.is_empty() {
            let _ = Command::new("podman")
                .args(["rm", "--force", "--time=0"])
                .args(&self.containers)
                .stdout(Stdio::null())
                .status();
        }
        // Unpinning detaches the programs of a daemon that did not remove its pins.
        let _ = fs::remove_dir_all(&self.pins);
        let _ = fs::remove_dir_all(&self.socket_dir);
    }
}

/// Removes what an earlier check that was itself killed left: its containers, socket directory
/// and pins, for PIDs that are gone.
fn remove_stale() {
    let gone = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.split('-').next()?.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists())
    };
    let containers = output(Command::new("podman").args([
        "ps",
        "--all",
        "--format",
        "{{.Names}}",
        "--filter",
        &format!("name=^{PREFIX}-"),
    ]))
    .unwrap_or_default();
    let stale: Vec<&str> = containers.lines().filter(|n| gone(n)).collect();
    if !stale.is_empty() {
        eprintln!("xtask: removing stale containers {}", stale.join(" "));
        // A daemon still running stops for good first (SIGTERM): it kills the trees it holds.
        // (`podman stop` would send the image's STOPSIGNAL, SIGHUP: a hand-over.)
        let _ = Command::new("podman")
            .args(["kill", "--signal=TERM"])
            .args(&stale)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("timeout")
            .args(["30", "podman", "wait"])
            .args(&stale)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("podman")
            .args(["rm", "--force", "--time=0"])
            .args(&stale)
            .stdout(Stdio::null())
            .status();
    }
    for dir in ["/sys/fs/bpf", "/tmp"] {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            if gone(&entry.file_name().to_string_lossy()) {
                eprintln!("xtask: removing stale {}", entry.path().display());
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// podman's flags beyond the DaemonSet's that this machine needs, each said when used.
fn machine_flags() -> Result<Vec<String>> {
    let mut flags = Vec::new();
    // crun (Debian's default runtime) refuses a hybrid cgroup hierarchy whose cgroup2 part has
    // controllers ("cgroups in hybrid mode not supported"); runc runs there.
    let unified =
        fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").unwrap_or_default();
    if !unified.trim().is_empty() {
        if output(Command::new("runc").arg("--version")).is_err() {
            apt_install(&["runc"], false)?;
        }
        flags.push("--runtime=runc".to_owned());
    }
    // Without CAP_SYS_RESOURCE (a sandbox's root may lack it), the runtime cannot raise the
    // container's open file and process limits to podman's default (1048576): give it what
    // podman itself has, its hard open file limit and a process limit no higher than the
    // 32768 podman sets for itself as it starts. The process limit does not bind a holder of
    // CAP_SYS_ADMIN, as the daemon is.
    if !has_capability(24) {
        let nofile = hard_limit("Max open files")?;
        let nproc = hard_limit("Max processes")?.min(32768);
        flags.push(format!("--ulimit=nofile={nofile}:{nofile}"));
        flags.push(format!("--ulimit=nproc={nproc}:{nproc}"));
    }
    Ok(flags)
}

fn has_capability(bit: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&hex, 16).ok()
        })
        .is_some_and(|caps| caps >> bit & 1 == 1)
}

/// This process's hard limit of `name` in /proc/self/limits.
fn hard_limit(name: &str) -> Result<u64> {
    let limits = fs::read_to_string("/proc/self/limits")?;
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .with_context(|| format!("no {name} in /proc/self/limits"))?;
    let hard = line.split_whitespace().nth(1).context("a hard limit")?;
    Ok(if hard == "unlimited" {
        u64::MAX
    } else {
        hard.parse()?
    })
}

/// Runs one check, printing PASS or FAIL, its name and the time it took.
fn timed<T>(name: &str, check: impl FnOnce() -> Result<T>) -> Result<T> {
    let at = Instant::now();
    let result = check();
    let took = at.elapsed().as_secs_f64();
    match &result {
        Ok(_) => println!("PASS {name} ({took:.1}s)"),
        Err(e) => println!("FAIL {name} ({took:.1}s): {e:#}"),
    }
    result.with_context(|| format!("check failed: {name}"))
}

/// A process's start time (field 22 of /proc/PID/stat), which tells it from a later one with
/// the same pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the comm: state is field 3, start time field 22.
    if matches!(fields.first(), Some(&"Z" | &"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether the process that was `pid` at `start` still runs (not a zombie).
fn alive((pid, start): (u32, u64)) -> bool {
    start_time(pid) == Some(start)
}

fn alive_child(child: &mut Child) -> bool {
    child.try_wait().ok().flatten().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The manifest's pins directory, which [`DAEMON_ARGS`] replaces.
    const DAEMONSET_PINS: &str = "/sys/fs/bpf/leash";

    /// The manifest's lines, trimmed, comments and blank lines left out.
    fn manifest_lines() -> Vec<String> {
        let path = workspace_root().join("dist/kubernetes/leash-daemonset.yaml");
        fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_flags_mirror_what_the_daemonset_says() {
        let lines = manifest_lines();
        for (setting, flags) in DAEMONSET {
            assert!(
                lines.windows(setting.len()).any(|w| w == *setting),
                "dist/kubernetes/leash-daemonset.yaml no longer says {setting:?}: change \
                 podman's flags for it ({flags:?}) in xtask/src/image.rs and docs/DEPLOY.md"
            );
        }
        let args: Vec<String> = DAEMON_ARGS
            .iter()
            .map(|a| format!("- \"{}\"", a.replace("{pins}", DAEMONSET_PINS)))
            .collect();
        assert!(
            lines.windows(args.len()).any(|w| w == args),
            "the DaemonSet's args are no longer {DAEMON_ARGS:?}"
        );
    }

    #[test]
    fn the_build_stage_collects_the_libraries() {
        let text = fs::read_to_string(workspace_root().join("dist/Containerfile")).unwrap();
        let run = build_stage_last_run(&text).unwrap();
        assert!(run.starts_with("mkdir /runtime"), "{run}");
        assert!(
            text.contains(&format!("COPY --from=build /{BUILD_STAGE_BINARY} ")),
            "the runtime stage copies the binary from elsewhere than /{BUILD_STAGE_BINARY}"
        );
    }
}
