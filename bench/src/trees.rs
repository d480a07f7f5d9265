//! The process trees the benchmarks kill, and the ways of killing them that leash is compared
//! with: cgroup.kill, a PPID walk with SIGKILL, killpg.

use std::{
    collections::BTreeSet,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use leash::sys::Pidfd;
use leash_tests::{CHAIN, Cgroup, wait_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// The root starts every other process itself.
    Fan,
    /// Each process starts the next.
    Chain,
    /// Each process starts the next in a session of its own.
    SetsidChain,
    /// The root double-forks every other process: they are reparented out of its subtree.
    DoubleForked,
}

impl Shape {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::Fan => "fan",
            Shape::Chain => "chain",
            Shape::SetsidChain => "setsid chain",
            Shape::DoubleForked => "double-forked",
        }
    }

    /// A command, inside `cgroup`, that grows into `n` sleeping processes (the root included).
    pub(crate) fn command(self, cgroup: &Cgroup, n: usize) -> Command {
        let others = (n - 1).to_string();
        let mut command = match self {
            Shape::Fan => cgroup.command(
                "sh",
                &[
                    "-c",
                    "for i in $(seq $1); do sleep 600 & done; exec sleep 600",
                    "sh",
                    &others,
                ],
            ),
            Shape::DoubleForked => cgroup.command(
                "sh",
                &[
                    "-c",
                    "for i in $(seq $1); do (sleep 600 &); done; exec sleep 600",
                    "sh",
                    &others,
                ],
            ),
            Shape::Chain | Shape::SetsidChain => {
                cgroup.command("sh", &["-c", CHAIN, CHAIN, &others])
            }
        };
        let hop = if self == Shape::SetsidChain {
            "setsid"
        } else {
            ""
        };
        command.env("LEASH_HOP", hop);
        command
    }
}

/// Waits until the tree has grown into its `n` sleeping processes.
pub(crate) fn settle(cgroup: &Cgroup, n: usize) {
    cgroup.settle(n, &["sleep"]);
}

/// The kernel's own: cgroup.kill, until the group is empty.
pub(crate) fn cgroup_kill(cgroup: &Cgroup) -> Result<Duration> {
    let started = Instant::now();
    fs::write(cgroup.procs_file().with_file_name("cgroup.kill"), "1")?;
    wait_unpopulated(cgroup, Duration::from_secs(60))?;
    Ok(started.elapsed())
}

/// The referee for every method: the kernel's `populated 0` for the group, polled every
/// 100 µs (so a method's time is exact to about that).
pub(crate) fn wait_unpopulated(cgroup: &Cgroup, timeout: Duration) -> Result<()> {
    let events = cgroup.procs_file().with_file_name("cgroup.events");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if fs::read_to_string(&events)?.contains("populated 0") {
            return Ok(());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    bail!("{} still populated after {timeout:?}", events.display())
}

/// What tree-kill libraries do: walk /proc for the root's descendants by parent pid, SIGKILL
/// them, and walk again until none is found. Returns the time and the processes that escaped
/// (still in the cgroup after the walk found nothing more).
pub(crate) fn ppid_walk_kill(root: u32, cgroup: &Cgroup) -> Result<(Duration, usize)> {
    let started = Instant::now();
    loop {
        let snapshot = leash::proc::all_processes()?;
        let mut targets: Vec<u32> = leash::proc::descendants(&snapshot, root, |_| false)
            .iter()
            .filter(|p| p.is_live())
            .map(|p| p.pid)
            .collect();
        if snapshot.iter().any(|p| p.pid == root && p.is_live()) {
            targets.push(root);
        }
        if targets.is_empty() {
            break;
        }
        for pid in targets {
            if let Ok(pidfd) = Pidfd::open(pid) {
                let _ = pidfd.send_signal(9);
            }
        }
    }
    let took = started.elapsed();
    Ok((took, live_in(cgroup).len()))
}

/// killpg(root's group, SIGKILL): what a supervisor that started the root in its own process
/// group does.
pub(crate) fn killpg(root: u32) -> Result<Duration> {
    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-KILL", "--", &format!("-{root}")])
        .status()?;
    if !status.success() {
        bail!("kill -KILL -{root} failed");
    }
    Ok(started.elapsed())
}

/// The group's processes that are still running (zombies waiting for their parent do not
/// count: they run nothing).
pub(crate) fn live_in(cgroup: &Cgroup) -> BTreeSet<u32> {
    cgroup
        .procs()
        .into_iter()
        .filter(|&pid| leash::proc::process(pid).is_some_and(|p| p.is_live()))
        .collect()
}

/// Reaps a root this program started, whatever killed it.
pub(crate) fn reap(mut root: Child) {
    let _ = root.kill();
    let _ = root.wait();
}

/// The small C process maker, compiled the first time a section asks for it.
#[derive(Default)]
pub(crate) struct Forker(std::cell::OnceCell<PathBuf>);

impl Forker {
    /// Its path, compiling it first if no section has yet.
    pub(crate) fn path(&self) -> Result<&Path> {
        match self.0.get() {
            Some(path) => Ok(path),
            None => {
                let built = build_forker()?;
                Ok(self.0.get_or_init(|| built))
            }
        }
    }
}

/// Compiles the small C process maker into the build directory.
fn build_forker() -> Result<PathBuf> {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/src/forker.c");
    let exe = std::env::current_exe()?;
    let out = exe.with_file_name("leash-forker");
    let status = Command::new("cc")
        .args(["-O2", "-static", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .context("running cc (the benchmarks need a C compiler)")?;
    if !status.success() {
        bail!("compiling {source} failed");
    }
    Ok(out)
}

/// Waits up to `timeout` for `condition`; an error saying `what` if it never holds.
pub(crate) fn await_that(
    what: &str,
    timeout: Duration,
    condition: impl FnMut() -> bool,
) -> Result<()> {
    if wait_for(timeout, condition) {
        Ok(())
    } else {
        bail!("timed out waiting for {what}")
    }
}

/// The forker's fan of `n` sleeping children inside `group`. Given `uid`, the fan's root runs
/// as that user once its children exist (they stay root's: a user's process limit may be under
/// `n`), so that the user may register it. Its stdin and stdout are piped: see [`wait_ready`].
pub(crate) fn fan(forker: &Path, group: &Cgroup, n: usize, uid: Option<u32>) -> Command {
    let forker = forker.to_str().unwrap_or_default();
    let mut args = vec!["fan".to_owned(), n.to_string()];
    args.extend(uid.map(|uid| uid.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command = group.command(forker, &args);
    command.stdin(Stdio::piped()).stdout(Stdio::piped());
    command
}

/// Waits for the forker's "ready" line: all its children exist.
pub(crate) fn wait_ready(root: &mut Child) -> Result<()> {
    let stdout = root.stdout.take().context("the forker's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("the forker did not get ready: {line:?}");
    }
    // Its stdin stays open (piped) until reap(), so it waits there.
    Ok(())
}

/// Waits until the machine has about `baseline` processes again: the init here reaps a killed
/// tree's orphans slowly, and the next large tree needs the pids back.
pub(crate) fn await_reaped(baseline: usize) -> Result<()> {
    await_that(
        "init to reap the killed tree",
        Duration::from_secs(120),
        || leash::proc::all_processes().is_ok_and(|all| all.len() < baseline + 1000),
    )
}

/// Raises kernel.pid_max for the run when needed, and puts it back.
pub(crate) struct PidMax {
    was: Option<String>,
}

impl PidMax {
    const PATH: &str = "/proc/sys/kernel/pid_max";

    pub(crate) fn at_least(wanted: usize) -> Result<Self> {
        let was = fs::read_to_string(Self::PATH)?;
        if was.trim().parse::<usize>()? >= wanted {
            return Ok(Self { was: None });
        }
        fs::write(Self::PATH, wanted.to_string()).context("raising kernel.pid_max")?;
        Ok(Self { was: Some(was) })
    }
}

impl Drop for PidMax {
    fn drop(&mut self) {
        if let Some(was) = &self.was {
            let _ = fs::write(Self::PATH, was.trim());
        }
    }
}
