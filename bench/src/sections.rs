//! Benchmarks 1, 2, 3 and 5: overhead, kill latency, escapes, scale (detection is in
//! detection.rs, hostile load in load.rs).

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use leash_client::{Client, RootExitPolicy, TreeOptions};
use leash_tests::{Cgroup, daemon::Daemon};

use crate::{
    Plan,
    measure::{Report, f1, f2, f3, median, median_ratio, ms},
    trees::{
        PidMax, Shape, await_reaped, await_that, cgroup_kill, fan, killpg, live_in, ppid_walk_kill,
        reap, settle, wait_ready, wait_unpopulated,
    },
};

const GRACE_0: TreeOptions = TreeOptions {
    on_root_exit: RootExitPolicy::Kill,
    grace: Some(Duration::ZERO),
};

fn start_daemon() -> Result<Daemon> {
    Daemon::start(&[]).context("the daemon cannot start without BPF")
}

/// 1. What leash costs fork-heavy work that it watches, or only runs beside.
pub(crate) fn overhead(plan: &Plan, report: &mut Report) -> Result<()> {
    let n = plan.overhead_loops;
    // What `ps` and `top` do: read every process's /proc/PID/stat. Each read of another
    // process's passes the kernel's ptrace check (read mode), where the ptrace guard runs.
    let passes = (n / 20).max(1);
    let loops = [
        (
            "fork+exit+wait".to_owned(),
            format!("i=0; while [ $i -lt {n} ]; do (:); i=$((i+1)); done"),
        ),
        (
            "fork+exec(/bin/true)+wait".to_owned(),
            format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"),
        ),
        (
            format!("ps: every /proc/PID/stat read, {passes} passes"),
            format!(
                "i=0; while [ $i -lt {passes} ]; do for f in /proc/[0-9]*/stat; do \
                 {{ read -r line < $f; }} 2>/dev/null; done; i=$((i+1)); done"
            ),
        ),
    ];
    // [loop][variant]: (a) no leash, (b) daemon running, loop untracked, (c) loop tracked.
    let mut times = vec![[Vec::new(), Vec::new(), Vec::new()]; loops.len()];
    let mut guard = String::new();
    for _ in 0..plan.overhead_reps {
        for (l, (_, script)) in loops.iter().enumerate() {
            times[l][0].push(time_shell(script, None)?);
        }
        let daemon = start_daemon()?;
        let mut client = daemon.client();
        guard = ptrace_guard(&mut client)?;
        for (l, (_, script)) in loops.iter().enumerate() {
            times[l][1].push(time_shell(script, None)?);
            times[l][2].push(time_shell(script, Some(&mut client))?);
        }
    }
    report.section(
        "1. Overhead on fork-heavy work",
        &format!(
            "A shell loop of {n} iterations, timed whole: (a) with no leash loaded, (b) with the \
             daemon running and the loop untracked, (c) with the loop inside a tracked tree. \
             {} repetitions, a, b and c in turn within each. Goals: b/a ≤ 1.01, c/a ≤ 1.03. \
             The ps row reads every process's /proc/PID/stat, {passes} times over: each read \
             passes the kernel's ptrace check, where the fmod_ret ptrace guard runs (the \
             fallback's syscall tracepoints run on no read, but put every system call on the \
             traced path). Ptrace guard in place: {guard}.",
            plan.overhead_reps
        ),
    );
    let rows: Vec<Vec<String>> = loops
        .iter()
        .zip(&times)
        .map(|((name, _), [a, b, c])| {
            let (ba, ca) = (median_ratio(b, a), median_ratio(c, a));
            vec![
                name.clone(),
                f1(median(a)),
                f1(median(b)),
                f1(median(c)),
                format!("{} {}", f3(ba), verdict(ba <= 1.01)),
                format!("{} {}", f3(ca), verdict(ca <= 1.03)),
            ]
        })
        .collect();
    report.table(
        &[
            "loop",
            "a: no leash (ms)",
            "b: untracked (ms)",
            "c: tracked (ms)",
            "b/a",
            "c/a",
        ],
        &rows,
    );
    program_costs(&[&loops[1].1, &loops[2].1], report)
}

/// The ptrace guard's programs the daemon reports, or "none".
fn ptrace_guard(client: &mut Client) -> Result<String> {
    let guard: Vec<String> = client
        .status()?
        .programs
        .into_iter()
        .filter(|program| program.contains("ptrace") || program.contains("sys_enter"))
        .collect();
    Ok(if guard.is_empty() {
        "none".to_owned()
    } else {
        guard.join(", ")
    })
}

/// Runs `sh -c script` to the end (in a tree of `client`'s lease if given); its time in ms.
fn time_shell(script: &str, client: Option<&mut Client>) -> Result<f64> {
    let mut command = Command::new("sh");
    command.args(["-c", script]);
    let started = Instant::now();
    let status = match client {
        Some(client) => client
            .spawn(&mut command, &TreeOptions::default())?
            .1
            .wait()?,
        None => command.status()?,
    };
    if !status.success() {
        bail!("the loop failed: {status}");
    }
    Ok(ms(started.elapsed()))
}

/// The kernel's own accounting of each program's runs (bpf_stats_enabled), over one tracked
/// and one untracked run of each loop.
fn program_costs(scripts: &[&str], report: &mut Report) -> Result<()> {
    let daemon = start_daemon()?;
    let mut client = daemon.client();
    let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enabling BPF stats")?;
    for script in scripts {
        time_shell(script, Some(&mut client))?;
        time_shell(script, None)?;
    }
    let mut rows = Vec::new();
    for info in aya::programs::loaded_programs().filter_map(Result::ok) {
        let name = info.name_as_str().unwrap_or_default().to_owned();
        if !name.starts_with("leash_") || info.run_count() == 0 {
            continue;
        }
        let per_run = info.run_time().as_nanos() as f64 / info.run_count() as f64;
        rows.push(vec![name, info.run_count().to_string(), f1(per_run)]);
    }
    drop(stats);
    rows.sort();
    report.line(
        "Each program's cost per run, from the kernel's BPF run-time statistics, over one \
         tracked and one untracked exec loop and ps loop (every fork, exit, exec and ptrace \
         check on the machine meanwhile counts: the fork program runs for all of them, and \
         does one map lookup for a non-member; the ptrace guard leaves a read-mode check \
         before any lookup):",
    );
    report.table(&["program", "runs", "ns per run"], &rows);
    Ok(())
}

/// 2. From the root's death to an empty tree, against cgroup.kill and a PPID walk.
pub(crate) fn kill_latency(plan: &Plan, report: &mut Report) -> Result<()> {
    let shapes: &[Shape] = if plan.quick {
        &[Shape::Fan, Shape::SetsidChain]
    } else {
        &[
            Shape::Fan,
            Shape::Chain,
            Shape::SetsidChain,
            Shape::DoubleForked,
        ]
    };
    let daemon = start_daemon()?;
    let mut client = daemon.client();
    let mut rows = Vec::new();
    let mut at_1000 = Vec::new();
    for &shape in shapes {
        for &n in plan.kill_sizes {
            let (mut leash, mut cgroup, mut walk, mut escaped) = (vec![], vec![], vec![], vec![]);
            for _ in 0..plan.kill_reps {
                // leash: SIGKILL the root; the daemon kills the rest (grace 0).
                let group = Cgroup::new("bench-kill-leash");
                let (_tree, mut root) = client.spawn(&mut shape.command(&group, n), &GRACE_0)?;
                settle(&group, n);
                let started = Instant::now();
                root.kill()?;
                wait_unpopulated(&group, Duration::from_secs(60))?;
                leash.push(ms(started.elapsed()));
                reap(root);

                let group = Cgroup::new("bench-kill-cgroup");
                let root = shape.command(&group, n).spawn()?;
                settle(&group, n);
                cgroup.push(ms(cgroup_kill(&group)?));
                reap(root);

                let group = Cgroup::new("bench-kill-walk");
                let root = shape.command(&group, n).spawn()?;
                settle(&group, n);
                let (took, left) = ppid_walk_kill(root.id(), &group)?;
                walk.push(ms(took));
                escaped.push(left as f64);
                reap(root);
            }
            let ratio = median_ratio(&leash, &cgroup);
            if n == 1000 {
                at_1000.push(ratio);
            }
            eprintln!(
                "kill {} {n}: leash {:.1} ms, cgroup.kill {:.1} ms",
                shape.name(),
                median(&leash),
                median(&cgroup)
            );
            rows.push(vec![
                shape.name().to_owned(),
                n.to_string(),
                f1(median(&leash)),
                f1(median(&cgroup)),
                f2(ratio),
                f1(median(&walk)),
                format!("{:.0}", median(&escaped)),
            ]);
        }
    }
    report.section(
        "2. Kill latency",
        &format!(
            "Trees of sleeping processes in their own cgroup. leash: SIGKILL the root, the \
             daemon kills the rest (grace 0). References on the same tree in the same \
             repetition: cgroup.kill, and a PPID walk + SIGKILL repeated until it finds nothing. \
             The referee for all: the cgroup's `populated 0`, polled every 100 µs. {} \
             repetitions. Goal: leash ≤ 1.5 × cgroup.kill at 1000.",
            plan.kill_reps
        ),
    );
    report.table(
        &[
            "shape",
            "processes",
            "leash (ms)",
            "cgroup.kill (ms)",
            "leash / cgroup.kill",
            "PPID walk (ms)",
            "left alive by the walk",
        ],
        &rows,
    );
    let worst = at_1000.iter().copied().fold(f64::NAN, f64::max);
    report.line(&format!(
        "At 1000 processes, leash / cgroup.kill is at most {} over the shapes: {}.",
        f2(worst),
        verdict(worst <= 1.5)
    ));
    Ok(())
}

/// 3. A setsid fork chain killed while it grows: who survives.
pub(crate) fn escapes(plan: &Plan, report: &mut Report) -> Result<()> {
    const KILL_AT: usize = 300;
    let daemon = start_daemon()?;
    let mut client = daemon.client();
    let methods = ["leash", "cgroup.kill", "PPID walk", "killpg"];
    let mut survivors = vec![Vec::new(); methods.len()];
    for _ in 0..plan.escape_trials {
        for (m, method) in methods.iter().enumerate() {
            let group = Cgroup::new("bench-escape");
            let mut command = Shape::SetsidChain.command(&group, 5000);
            let (tree, root) = if *method == "leash" {
                let (tree, root) = client.spawn(&mut command, &GRACE_0)?;
                (Some(tree), root)
            } else {
                use std::os::unix::process::CommandExt;
                (None, command.process_group(0).spawn()?)
            };
            await_that("the chain to grow", Duration::from_secs(60), || {
                group.procs().len() >= KILL_AT
            })?;
            match (*method, tree) {
                ("leash", Some(tree)) => {
                    client.kill(tree, Some(Duration::ZERO))?;
                }
                ("cgroup.kill", _) => {
                    cgroup_kill(&group)?;
                }
                ("PPID walk", _) => {
                    ppid_walk_kill(root.id(), &group)?;
                }
                _ => {
                    killpg(root.id())?;
                }
            }
            // What is still running a moment after the method is done: the escapees go on.
            thread::sleep(Duration::from_millis(100));
            survivors[m].push(live_in(&group).len() as f64);
            reap(root);
        }
    }
    report.section(
        "3. Escapes",
        &format!(
            "A fork chain that calls setsid at every hop, killed once it has {KILL_AT} processes \
             and is still forking; survivors are the processes still running in its cgroup \
             100 ms after the method returned. {} trials per method, methods in turn. Goal: \
             leash 0, like cgroup.kill.",
            plan.escape_trials
        ),
    );
    let rows: Vec<Vec<String>> = methods
        .iter()
        .zip(&survivors)
        .map(|(method, counts)| {
            let clean = counts.iter().filter(|&&c| c == 0.0).count();
            let max = counts.iter().copied().fold(0.0, f64::max);
            vec![
                (*method).to_owned(),
                format!("{clean}/{}", counts.len()),
                format!("{:.0}", median(counts)),
                format!("{max:.0}"),
            ]
        })
        .collect();
    report.table(
        &[
            "method",
            "trials with 0 survivors",
            "median survivors",
            "max",
        ],
        &rows,
    );
    Ok(())
}

/// 5. Many tracked processes; the daemon's footprint idle and under a fork storm.
pub(crate) fn scale(plan: &Plan, forker: &Path, report: &mut Report) -> Result<()> {
    let n = plan.scale;
    // Two trees of n, and the first one's zombies while init reaps them.
    let _pid_max = PidMax::at_least(n * 2 + 20_000)?;
    let baseline = leash::proc::all_processes()?.len();
    // The adoption's line (DEBUG) says how many /proc reads its walks took.
    let daemon = Daemon::start_wrapped(&["env", ADOPTION_LOG], &[])
        .context("the daemon cannot start without BPF")?;
    let mut client = daemon.client();
    let fan = |group: &Cgroup| fan(forker, group, n, None);
    let await_reaped = || await_reaped(baseline);

    // The first build this large after boot pays for growing the kernel's task and pid caches
    // (2-3 times as long as the next one, tracked or not), so an untimed build goes first.
    let group = Cgroup::new("bench-scale-warmup");
    let mut root = fan(&group).spawn()?;
    wait_ready(&mut root)?;
    cgroup_kill(&group)?;
    reap(root);
    await_reaped()?;

    // Built inside a tracked tree: every child joins at fork.
    let group = Cgroup::new("bench-scale-leash");
    let mut command = fan(&group);
    let started = Instant::now();
    let (tree, mut root) = client.spawn(&mut command, &GRACE_0)?;
    wait_ready(&mut root)?;
    let tracked_build = started.elapsed();
    let rss_tracking_n = rss_mib(daemon.pid())?;
    let truth = group.procs();
    // The kernel's count of the tree (`list` names at most 1000 members a tree, and counts
    // them all).
    let counted = client
        .list()?
        .iter()
        .find(|t| t.tree == tree)
        .map_or(0, |t| t.member_count);
    let fidelity = format!(
        "{counted} tracked / {} in the cgroup: {}",
        truth.len(),
        if counted == truth.len() as u64 {
            "equal"
        } else {
            "NOT equal"
        }
    );
    // Registering a new process costs the same on a crowded machine: a process with no
    // children needs no /proc walk.
    // (They live until all are timed: a kill walks the whole member map, and would hold the
    // tracker while the next one registers.)
    let mut spawn_times = Vec::new();
    let mut spawned = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let (tree, child) = client.spawn(Command::new("sleep").arg("600"), &GRACE_0)?;
        spawn_times.push(ms(started.elapsed()));
        spawned.push((tree, child));
    }
    for (tree, child) in spawned {
        client.kill(tree, Some(Duration::ZERO))?;
        reap(child);
    }
    let started = Instant::now();
    client.kill(tree, Some(Duration::ZERO))?;
    let leash_kill = started.elapsed();
    reap(root);
    await_reaped()?;

    // The same tree untracked, killed by the kernel.
    let group = Cgroup::new("bench-scale-cgroup");
    let started = Instant::now();
    let mut root = fan(&group).spawn()?;
    wait_ready(&mut root)?;
    let untracked_build = started.elapsed();
    // Registering it as it is: the root and its n children found in /proc.
    let started = Instant::now();
    let adopted = client.adopt(root.id(), &GRACE_0)?;
    let adoption = started.elapsed();
    let reads_per_member = adoption_reads(&daemon.log())?;
    client.release(adopted)?;
    // What any /proc walk of it costs at least: one stat read per process.
    let started = Instant::now();
    let stats_read = group
        .procs()
        .iter()
        .filter(|pid| fs::read(format!("/proc/{pid}/stat")).is_ok())
        .count();
    let stat_pass = started.elapsed();
    let kernel_kill = cgroup_kill(&group)?;
    reap(root);

    // The daemon at rest, then under a tracked fork storm.
    let idle = footprint(daemon.pid(), Duration::from_secs(2), || Ok(None))?;
    let rss_just_started = rss_from_start(&daemon.dir.join("just-started"))?;
    let dropped_before = client.status()?.events_dropped;
    // One storming process per core: a single one is bound by its own fork+wait round trip.
    let workers = thread::available_parallelism().map_or(2, |n| n.get());
    let storm = footprint(daemon.pid(), Duration::from_secs(3), || {
        let mut storm = Command::new(forker);
        storm
            .args(["storm", "3", &workers.to_string()])
            .stdout(Stdio::piped());
        let (_tree, child) = client.spawn(&mut storm, &TreeOptions::default())?;
        let output = child.wait_with_output()?;
        let forks: f64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap_or(0.0);
        Ok(Some(forks / 3.0))
    })?;
    let dropped = client.status()?.events_dropped - dropped_before;

    report.section(
        "5. Scale",
        &format!(
            "{n} sleeping processes (children of one small C process, so that they fit in \
             memory), tracked from their fork; the same tree untracked as the reference. \
             pid_max is raised for the run and put back."
        ),
    );
    report.table(
        &["measure", "leash", "reference"],
        &[
            vec![
                format!("build {n} processes (ms)"),
                f1(ms(tracked_build)),
                format!("{} untracked", f1(ms(untracked_build))),
            ],
            vec!["fidelity".into(), fidelity, String::new()],
            vec![
                "register a new process beside them (spawn, median of 5, ms)".into(),
                f2(median(&spawn_times)),
                String::new(),
            ],
            vec![
                format!("register an existing tree of {n} (adopt, ms)"),
                f1(ms(adoption)),
                format!(
                    "{} to read {stats_read} /proc/PID/stat once",
                    f1(ms(stat_pass))
                ),
            ],
            vec![
                "its /proc reads per member adopted".into(),
                f1(reads_per_member),
                String::new(),
            ],
            vec![
                format!("kill {n} (ms)"),
                f1(ms(leash_kill)),
                format!("{} cgroup.kill", f1(ms(kernel_kill))),
            ],
        ],
    );
    report.table(
        &[
            "daemon",
            "RSS (MiB)",
            "CPU (% of one core)",
            "forks/s",
            "kernel events dropped",
        ],
        &[
            vec![
                "just started: serving, no client yet".into(),
                f1(rss_just_started),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
            vec![
                format!("{n} members tracked (the tree above, built)"),
                f1(rss_tracking_n),
                "-".into(),
                "-".into(),
                "-".into(),
            ],
            vec![
                "idle, after its clients".into(),
                f1(idle.rss_mib),
                f1(idle.cpu_percent),
                "-".into(),
                "-".into(),
            ],
            vec![
                format!("tracked fork storm, {workers} forking processes"),
                f1(storm.rss_mib),
                f1(storm.cpu_percent),
                format!("{:.0}", storm.rate.unwrap_or(0.0)),
                dropped.to_string(),
            ],
        ],
    );
    Ok(())
}

/// The daemon's log filter for the scale section: INFO, and the adoption's DEBUG line.
const ADOPTION_LOG: &str = "LEASH_LOG=info,leash::kernel::register=debug";

/// The /proc reads per member of the last adoption in the daemon's `log`.
fn adoption_reads(log: &str) -> Result<f64> {
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("adoption finished"))
        .context("the daemon logged no adoption")?;
    let value = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("proc_reads_per_member="))
        .context("the adoption's line has no proc_reads_per_member")?;
    value
        .parse()
        .with_context(|| format!("proc_reads_per_member={value}"))
}

struct Footprint {
    rss_mib: f64,
    cpu_percent: f64,
    rate: Option<f64>,
}

/// The daemon's RSS at the end and CPU share over `work` (or over `window` when it does
/// nothing).
fn footprint(
    pid: u32,
    window: Duration,
    work: impl FnOnce() -> Result<Option<f64>>,
) -> Result<Footprint> {
    let cpu = || -> Result<f64> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("stat")?
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / leash::proc::ticks_per_second() as f64)
    };
    let (cpu_before, started) = (cpu()?, Instant::now());
    let rate = work()?;
    if rate.is_none() {
        thread::sleep(window);
    }
    let (cpu_used, elapsed) = (cpu()? - cpu_before, started.elapsed().as_secs_f64());
    Ok(Footprint {
        rss_mib: rss_mib(pid)?,
        cpu_percent: 100.0 * cpu_used / elapsed,
        rate,
    })
}

pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "(goal met)" } else { "(goal missed)" }
}

/// Process `pid`'s resident memory (VmRSS), in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let rss_kib: f64 = fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(rss_kib / 1024.0)
}

/// A daemon's RSS once it serves, before any client has connected: what loading left behind.
/// A daemon of its own (unpinned, in `dir`), watched through its log rather than its socket, since a
/// connection's end is one of the times the daemon gives memory back.
fn rss_from_start(dir: &Path) -> Result<f64> {
    fs::create_dir_all(dir)?;
    let log = dir.join("daemon.log");
    let mut daemon = Command::new(leash_tests::leash_binary())
        .args(["daemon", "--no-pin", "--socket"])
        .arg(dir.join("leash.sock"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log)?)
        .spawn()?;
    let serving = await_that("the daemon to serve", Duration::from_secs(30), || {
        fs::read_to_string(&log).is_ok_and(|text| text.contains("leash daemon serving"))
    });
    let rss = serving.and_then(|()| rss_mib(daemon.id()));
    leash_tests::daemon::signal(daemon.id(), "TERM");
    daemon.wait()?;
    rss
}
