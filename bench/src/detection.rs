//! Section 4, detection: from a host's SIGKILL to the first signal its tree receives, for hosts of
//! every size. The kernel tears down a dying host's whole address space before its socket
//! closes or its pidfd turns readable; leash sees the death at the signal. The reference is
//! the host's exit as its parent sees it (waitpid), which is when those would have told.

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use leash_tests::{daemon::Daemon, python, workspace_root};

use crate::{
    Plan,
    measure::{Report, f2, median},
    sections::verdict,
    trees::await_that,
};

/// The tree's root: blocks SIGTERM and waits for it, then notes CLOCK_MONOTONIC in the file
/// named by its argument (written whole, by a rename).
const WAITER: &str = r#"
import signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
open(sys.argv[1] + ".ready", "w").close()
signal.sigwait({signal.SIGTERM})
t = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
open(sys.argv[1] + ".tmp", "w").write(str(t))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
"#;

/// A Python host on the host library, holding `argv[1]` MiB of touched memory, that leases the
/// waiter (`argv[2:]`) and waits.
const PYTHON_HOST: &str = r#"
import sys, leash
held = bytearray(int(sys.argv[1]) << 20)
held[::4096] = b"\x01" * len(held[::4096])
lease = leash.Lease()
agent = lease.popen(sys.argv[2:], grace=5)
sys.stdin.read()
"#;

/// The same in Node.js on its host library: `argv[2]` MiB, the library's path in `argv[3]`.
const NODE_HOST: &str = r#"
// With -e, the arguments follow node itself: no script path between.
const [mib, library, ...agent] = process.argv.slice(1);
const held = Buffer.alloc(Number(mib) << 20, 1);
const { Lease } = await import(library);
const lease = await Lease.connect({ graceMs: 5000 });
lease.spawn(agent[0], agent.slice(1), { stdio: "ignore" });
process.stdin.resume();
"#;

/// One kind of host the section measures.
#[derive(Clone, Copy)]
enum HostKind {
    /// `leash run`, a few MiB.
    Run,
    /// A Python host holding 1 GiB.
    PythonGib,
    /// A Node.js host holding 300 MiB.
    Node300,
}

impl HostKind {
    const ALL: [Self; 3] = [Self::Run, Self::PythonGib, Self::Node300];

    fn name(self) -> &'static str {
        match self {
            Self::Run => "tiny: `leash run`",
            Self::PythonGib => "Python host library, 1 GiB touched",
            Self::Node300 => "Node.js host library, 300 MiB touched",
        }
    }

    /// The host, leasing `agent`.
    fn command(self, daemon: &Daemon, agent: &[String]) -> Command {
        let mut command = match self {
            Self::Run => {
                let mut run = daemon.leash();
                run.args(["run", "--grace", "5s", "--"]);
                run
            }
            Self::PythonGib => {
                let mut host = Command::new(python());
                host.args(["-c", PYTHON_HOST, "1024"]);
                host
            }
            Self::Node300 => {
                let library = workspace_root().join("clients/node/src/index.js");
                let mut host = Command::new("node");
                host.args(["--input-type=module", "-e", NODE_HOST, "300"])
                    .arg(library);
                host
            }
        };
        daemon
            .python_host(command.args(agent))
            .stdin(Stdio::piped())
            .stdout(Stdio::null());
        command
    }
}

/// What one trial saw, in ms after the host's SIGKILL.
struct Trial {
    first_signal: f64,
    host_reaped: f64,
}

pub(crate) fn detection(plan: &Plan, report: &mut Report) -> Result<()> {
    let daemon = Daemon::start(&[]).context("the daemon cannot start without BPF")?;
    let mut trials: Vec<Vec<Trial>> = HostKind::ALL.iter().map(|_| Vec::new()).collect();
    for trial in 0..plan.detection_trials {
        // The kinds in turn within each trial: what disturbs the machine meanwhile, disturbs
        // all of them.
        for (kind, seen) in HostKind::ALL.into_iter().zip(&mut trials) {
            let stamp = daemon.dir.join(format!("signalled-{trial}-{}", kind as u8));
            seen.push(one_trial(&daemon, kind, &stamp)?);
        }
    }
    report.section(
        "4. Detection",
        &format!(
            "Each host leases a Python process that blocks SIGTERM and waits for it, then notes \
             CLOCK_MONOTONIC. The host is SIGKILLed; timed is its tree's first signal (grace \
             5 s: SIGTERM), and, as the reference, the host's exit as its parent's waitpid sees \
             it: when its socket closes and its pidfd turns readable, after the kernel has torn \
             down its memory. {} trials, the hosts in turn. Goal: median < 1 ms for each.",
            plan.detection_trials
        ),
    );
    let rows = HostKind::ALL
        .into_iter()
        .zip(&trials)
        .map(|(kind, seen)| {
            let first: Vec<f64> = seen.iter().map(|t| t.first_signal).collect();
            let reaped: Vec<f64> = seen.iter().map(|t| t.host_reaped).collect();
            let worst = first.iter().copied().fold(0.0, f64::max);
            vec![
                kind.name().to_owned(),
                f2(median(&first)),
                f2(worst),
                f2(median(&reaped)),
                verdict(median(&first) < 1.0).to_owned(),
            ]
        })
        .collect::<Vec<_>>();
    report.table(
        &[
            "host",
            "first signal, median (ms)",
            "max (ms)",
            "host reaped, median (ms)",
            "goal",
        ],
        &rows,
    );
    Ok(())
}

fn one_trial(daemon: &Daemon, kind: HostKind, stamp: &Path) -> Result<Trial> {
    let ready = stamp.with_extension("ready");
    let agent = vec![
        python(),
        "-c".to_owned(),
        WAITER.to_owned(),
        stamp.display().to_string(),
    ];
    let mut host = HostGuard(
        kind.command(daemon, &agent)
            .spawn()
            .with_context(|| format!("starting the host: {}", kind.name()))?,
    );
    await_that("the tree to start", Duration::from_secs(60), || {
        ready.exists()
    })?;
    let killed_at = leash::sys::monotonic_ns();
    host.0.kill()?;
    host.0.wait()?;
    let reaped_at = leash::sys::monotonic_ns();
    await_that("the tree's first signal", Duration::from_secs(10), || {
        stamp.exists()
    })?;
    let signalled_at: u64 = fs::read_to_string(stamp)?.trim().parse()?;
    let after_kill = |at: u64| at.saturating_sub(killed_at) as f64 / 1e6;
    Ok(Trial {
        first_signal: after_kill(signalled_at),
        host_reaped: after_kill(reaped_at),
    })
}

/// A host, killed and reaped if a trial fails before it does.
struct HostGuard(Child);

impl Drop for HostGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
