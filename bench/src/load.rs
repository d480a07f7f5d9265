//! Section 6, enforcement under hostile load: one uid's host is SIGKILLed, and its tree's end
//! timed, while another uid floods the daemon; the daemon's memory before, during and after
//! each flood; and what the flooding uid's requests got.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::Child,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use leash::sys::Pidfd;
use leash_tests::{
    Cgroup, comm,
    daemon::{Daemon, USER_A, USER_B},
    wait_for,
};

use crate::{
    Plan,
    flood::{Flooder, Mode, Tally},
    measure::{Report, f1, f2, median, ms},
    sections::verdict,
    trees::{PidMax, await_reaped, cgroup_kill, fan, wait_ready},
};

/// The flooding uid's connections.
const CONNECTIONS: usize = 1000;
/// The tree the flooding uid holds while it floods with `list`: each reply lists all of it.
const LISTED_TREE: usize = 10_000;
/// The timed host's tree: a shell with four children (six processes with the host).
const HOST_TREE: &str = "for i in 1 2 3 4; do sleep 600 & done; exec sleep 600";
const HOST_PROCESSES: usize = 6;
/// The longest a host is waited for on a daemon under no load (not a measure: a bound for a
/// shared, busy machine).
const SETUP_CAP: Duration = Duration::from_secs(60);
/// The hosts of uid A are started no faster than this, within its request rate: a
/// registration counts 20 of its 200 requests a second, and the hosts share one budget.
const HOST_SPACING: Duration = Duration::from_millis(250);
/// Between the start of a flood and the first timed kill.
const RAMP: Duration = Duration::from_millis(500);
/// The longest a daemon is given to stop on SIGTERM before it is SIGKILLed (one still serving
/// a dead flood's requests may not get to it for minutes).
const STOP_WAIT: Duration = Duration::from_secs(2);
/// Between an adoption's request and the kill timed during it.
const ADOPTION_HEAD_START: Duration = Duration::from_millis(100);
const RSS_EVERY: Duration = Duration::from_millis(50);
/// After a flood's connections closed, before the daemon's memory is read again.
const SETTLE_AFTER: Duration = Duration::from_millis(1500);
/// A daemon whose memory has no bound is stopped here (its flooder killed): the machine is
/// shared, and the answer is known by then.
const RSS_SAFETY_KIB: u64 = 3 << 20;
/// The goals.
const LATENCY_GOAL: f64 = 2.0;
const PEAK_GOAL_MIB: f64 = 64.0;
const AFTER_GOAL: f64 = 1.1;

/// What the whole section shares.
struct Bench<'a> {
    plan: &'a Plan,
    forker: &'a Path,
    /// This program, which runs itself as the flooder.
    flooder: PathBuf,
}

/// One load's figures.
struct Condition {
    name: String,
    kills: Kills,
    /// A new host's time from its start to its tree grown, under the load; None past
    /// the plan's `load_wait` (or not measured).
    registration: Option<f64>,
    memory: Memory,
    /// From the flood's end (its process gone) to the daemon's answer to a new client's
    /// `status`; None past the plan's `load_wait`.
    recovery: Option<f64>,
    tally: Option<Tally>,
    notes: Vec<String>,
}

#[derive(Default)]
struct Kills {
    /// From each SIGKILL to an empty tree, in ms (a kill past the cap counts at the cap).
    ms: Vec<f64>,
    capped: usize,
}

struct Memory {
    before_kib: u64,
    peak_kib: u64,
    after_kib: u64,
    /// The flood was stopped at [`RSS_SAFETY_KIB`].
    stopped: bool,
}

/// What loads the daemon while kills are timed.
#[derive(Clone, Copy)]
enum Load {
    Idle,
    /// uid B floods through [`CONNECTIONS`] connections, holding a tree of [`LISTED_TREE`]
    /// if `listed`.
    Flood {
        mode: Mode,
        listed: bool,
    },
    /// uid B holds a tree of [`LISTED_TREE`] and asks nothing: the baseline of the floods that
    /// hold it (every kill walks the member map, which that tree fills).
    Held,
}

pub(crate) fn hostile_load(plan: &Plan, forker: &Path, report: &mut Report) -> Result<()> {
    let _pid_max = PidMax::at_least(plan.scale + LISTED_TREE + 20_000)?;
    let baseline = leash::proc::all_processes()?.len();
    let bench = Bench {
        plan,
        forker,
        flooder: std::env::current_exe()?,
    };
    let mut conditions = Vec::new();
    let mut started = Instant::now();
    let mut measured = |condition: Condition| {
        condition.log(started.elapsed());
        conditions.push(condition);
        started = Instant::now();
    };
    measured(under(&bench, "none (idle)", Load::Idle)?);
    measured(under(&bench, "none, a 10k tree held", Load::Held)?);
    measured(under(
        &bench,
        "`status` flood: 1000 connections",
        Load::Flood {
            mode: Mode::Status,
            listed: false,
        },
    )?);
    measured(under(
        &bench,
        "`list` flood: 1000 connections, a 10k tree",
        Load::Flood {
            mode: Mode::List,
            listed: true,
        },
    )?);
    measured(under(
        &bench,
        "unread `list`s: 1000 connections, a 10k tree",
        Load::Flood {
            mode: Mode::Unread,
            listed: true,
        },
    )?);
    measured(adoption(&bench, baseline)?);
    write_report(plan, &conditions, report);
    Ok(())
}

impl Bench<'_> {
    /// A daemon of this load's own (what one flood leaves behind never slows the next), past
    /// its first kill (whose one-time costs are not enforcement's).
    fn daemon(&self) -> Result<Daemon> {
        // The flooding uid may hold the whole adopted tree.
        let quota = leash::Capacity::default().members.to_string();
        let daemon = Daemon::start(&["--max-members-per-uid", &quota])
            .context("the daemon cannot start without BPF")?;
        let (host, _) = Host::start(&daemon, SETUP_CAP)?
            .context("the warm-up host got no tree from an idle daemon")?;
        host.kill_and_time(SETUP_CAP)?;
        Ok(daemon)
    }
}

/// No load, or a flood: hosts registered before the load starts are killed, one by one,
/// under it.
fn under(bench: &Bench, name: &str, load: Load) -> Result<Condition> {
    eprintln!("hostile load: {name}");
    let plan = bench.plan;
    let daemon = bench.daemon()?;
    let pid = daemon.pid();
    let (mut flooder, held, count, budget) = match load {
        Load::Idle => (None, None, plan.load_idle_trials, None),
        Load::Flood { .. } | Load::Held => {
            let (mode, listed, connections) = match load {
                Load::Flood { mode, listed } => (mode, listed, CONNECTIONS),
                _ => (Mode::Status, true, 0),
            };
            let held = match listed {
                true => Some(Fan::start(bench.forker, LISTED_TREE, USER_B)?),
                false => None,
            };
            let flooder = Flooder::start(
                &bench.flooder,
                &daemon.socket,
                USER_B,
                mode,
                connections,
                held.as_ref().map(|tree| tree.root.id()),
            )?;
            (
                Some(flooder),
                held,
                plan.load_trials,
                Some(plan.load_budget),
            )
        }
    };
    // At most `load_trials` hosts of uid A at once (a per-uid connection limit may be low);
    // with no load, the rest come in further batches.
    let mut hosts = start_hosts(&daemon, count.min(plan.load_trials))?;
    let before_kib = rss_kib(pid)?;
    let watch = RssWatch::start(pid, flooder.as_ref())?;
    if let Some(flooder) = &mut flooder {
        flooder.send("go")?;
        flooder.expect("flooding", Duration::from_secs(120))?;
        thread::sleep(RAMP);
    }
    let mut kills = Kills::default();
    loop {
        let batch = time_kills(hosts, budget, plan.load_cap, &watch)?;
        kills.ms.extend(batch.ms);
        kills.capped += batch.capped;
        let left = count.saturating_sub(kills.ms.len());
        if flooder.is_some() || left == 0 {
            break;
        }
        hosts = start_hosts(&daemon, left.min(plan.load_trials))?;
    }
    let registration = Host::start(&daemon, plan.load_wait)?.map(|(_, took)| took);
    let stopped = watch.tripped();
    let tally = match flooder.map(Flooder::finish) {
        None => None,
        Some(Ok(tally)) => Some(tally),
        Some(Err(_)) if stopped => None,
        Some(Err(e)) => return Err(e),
    };
    let peak_kib = watch.stop();
    let (after_kib, recovery) = after_the_load(&daemon, plan.load_wait)?;
    stop(daemon);
    drop(held);
    let mut notes = Vec::new();
    if stopped {
        notes.push(format!(
            "{name}: the flood was stopped when the daemon's RSS passed {} MiB.",
            RSS_SAFETY_KIB >> 10
        ));
    }
    Ok(Condition {
        name: name.into(),
        kills,
        registration,
        memory: Memory {
            before_kib,
            peak_kib,
            after_kib,
            stopped,
        },
        recovery,
        tally,
        notes,
    })
}

/// The daemon's RSS [`SETTLE_AFTER`] the load ended, and the time until it answers a new
/// client (measured meanwhile).
fn after_the_load(daemon: &Daemon, cap: Duration) -> Result<(u64, Option<f64>)> {
    let socket = daemon.socket.clone();
    let (answered, answer) = mpsc::channel();
    // Not joined: its connect could wait on a full backlog for as long as the daemon lets it.
    thread::spawn(move || answered.send(time_to_answer(&socket, cap)));
    thread::sleep(SETTLE_AFTER);
    let after_kib = rss_kib(daemon.pid())?;
    let recovery = answer
        .recv_timeout(cap.saturating_sub(SETTLE_AFTER) + Duration::from_millis(100))
        .ok()
        .flatten();
    Ok((after_kib, recovery))
}

/// `count` hosts, each with its tree, from a daemon under no load, at most one every
/// [`HOST_SPACING`].
fn start_hosts(daemon: &Daemon, count: usize) -> Result<Vec<Host>> {
    (0..count)
        .map(|_| {
            let next = Instant::now() + HOST_SPACING;
            let (host, _) = Host::start(daemon, SETUP_CAP)?
                .context("a host got no tree from a daemon under no load")?;
            thread::sleep(next.saturating_duration_since(Instant::now()));
            Ok(host)
        })
        .collect()
}

/// Stops `daemon`: SIGTERM, then SIGKILL past [`STOP_WAIT`].
fn stop(mut daemon: Daemon) {
    let pid = daemon.pid();
    leash_tests::daemon::signal(pid, "TERM");
    if !wait_for(STOP_WAIT, || !leash_tests::daemon::alive(pid)) {
        eprintln!("the daemon did not stop within {STOP_WAIT:?} of SIGTERM: SIGKILL");
    }
    // Reaps it; dropping it then removes its socket directory and its pins.
    daemon.kill_hard();
}

/// From now until the daemon answers a `status` on a new connection, in ms; None past `cap`.
fn time_to_answer(socket: &Path, cap: Duration) -> Option<f64> {
    let started = Instant::now();
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(cap)).ok()?;
    stream.write_all(b"{\"id\":1,\"op\":\"status\"}\n").ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    line.contains("\"ok\"").then(|| ms(started.elapsed()))
}

/// uid B registers an existing tree of `plan.scale` processes, then releases it, again; hosts
/// registered before each adoption are killed, one by one, while it is under way.
fn adoption(bench: &Bench, baseline: usize) -> Result<Condition> {
    let n = bench.plan.scale;
    let name = format!("adoption of a {}k tree", n / 1000);
    eprintln!("hostile load: {name}");
    let daemon = bench.daemon()?;
    let pid = daemon.pid();
    let tree = Fan::start(bench.forker, n, USER_B)?;
    let mut flooder = Flooder::start(&bench.flooder, &daemon.socket, USER_B, Mode::Adopt, 1, None)?;
    let before_kib = rss_kib(pid)?;
    let watch = RssWatch::start(pid, Some(&flooder))?;
    let plan = bench.plan;
    let (mut kills, mut adoptions, mut releases) = (Kills::default(), Vec::new(), Vec::new());
    let mut notes = Vec::new();
    for _ in 0..plan.load_adoptions {
        let hosts = start_hosts(&daemon, plan.load_trials)?;
        flooder.send(&format!("adopt {}", tree.root.id()))?;
        flooder.expect("sent", Duration::from_secs(10))?;
        thread::sleep(ADOPTION_HEAD_START);
        // One by one while the adoption is under way (its reply has not come); the rest are
        // killed untimed.
        let mut outcome = None;
        for host in hosts {
            outcome = flooder.try_line();
            if outcome.is_some() || watch.tripped() {
                break;
            }
            kills.record(host.kill_and_time(plan.load_cap)?, plan.load_cap);
        }
        let outcome = match outcome {
            Some(line) => line,
            None => flooder.next_line(Duration::from_secs(300))?,
        };
        match outcome.strip_prefix("adopted ") {
            Some(took) => {
                adoptions.push(took.trim().parse().context("the adoption's time")?);
                flooder.send("release")?;
                let took = flooder.expect("released", Duration::from_secs(120))?;
                releases.push(took.parse().context("the release's time")?);
            }
            None => notes.push(format!("{name}: the adoption was not served: {outcome}")),
        }
        if watch.tripped() {
            break;
        }
    }
    let stopped = watch.tripped();
    let tally = match flooder.finish() {
        Ok(tally) => Some(tally),
        Err(_) if stopped => None,
        Err(e) => return Err(e),
    };
    let peak_kib = watch.stop();
    let (after_kib, recovery) = after_the_load(&daemon, plan.load_wait)?;
    stop(daemon);
    notes.push(format!(
        "Adopting the {n} processes took {} ms, releasing them {} ms (medians of {}); every \
         timed kill of that row was sent while an adoption was under way.",
        f1(median(&adoptions)),
        f1(median(&releases)),
        adoptions.len(),
    ));
    drop(tree);
    await_reaped(baseline)?;
    Ok(Condition {
        name,
        kills,
        registration: None,
        memory: Memory {
            before_kib,
            peak_kib,
            after_kib,
            stopped,
        },
        recovery,
        tally,
        notes,
    })
}

/// Kills `hosts` one by one, timing each, while the next kill would still end within
/// `budget` if it took as long as the longest so far, and the flood was not stopped for its
/// memory (the rest are killed untimed).
fn time_kills(
    hosts: Vec<Host>,
    budget: Option<Duration>,
    cap: Duration,
    watch: &RssWatch,
) -> Result<Kills> {
    let started = Instant::now();
    let mut kills = Kills::default();
    for host in hosts {
        let longest = Duration::from_secs_f64(kills.ms.iter().copied().fold(0.0, f64::max) / 1e3);
        if budget.is_some_and(|budget| started.elapsed() + longest > budget) || watch.tripped() {
            break;
        }
        kills.record(host.kill_and_time(cap)?, cap);
    }
    Ok(kills)
}

impl Condition {
    fn log(&self, took: Duration) {
        eprintln!(
            "hostile load, {}: kill median {} ms, max {} ms ({} kills, {} at the cap); a new \
             host's tree in {:?} ms; RSS {:.1} -> peak {:.1} -> after {:.1} MiB; answers again \
             after {:?} ms; {}; took {took:.1?}",
            self.name,
            latency(median(&self.kills.ms)),
            latency(self.kills.ms.iter().copied().fold(f64::NAN, f64::max)),
            self.kills.ms.len(),
            self.kills.capped,
            self.registration,
            mib(self.memory.before_kib),
            mib(self.memory.peak_kib),
            mib(self.memory.after_kib),
            self.recovery,
            self.tally
                .as_ref()
                .map_or_else(|| "no tally".to_owned(), |t| format!("{t:?}")),
        );
    }
}

impl Kills {
    fn record(&mut self, took: Option<f64>, cap: Duration) {
        match took {
            Some(took) => self.ms.push(took),
            None => {
                self.ms.push(ms(cap));
                self.capped += 1;
            }
        }
    }
}

/// A host of uid A (`leash run`) with its small tree, in a cgroup of their own. Dropping it
/// kills and reaps the host; the cgroup, dropped after, kills whatever is left.
struct Host {
    process: Child,
    cgroup: Cgroup,
}

impl Host {
    /// Starts the host and waits (up to `cap`) for its tree to be registered and grown; with
    /// the time that took in ms, or None if it was not by then.
    fn start(daemon: &Daemon, cap: Duration) -> Result<Option<(Self, f64)>> {
        let started = Instant::now();
        let cgroup = Cgroup::new("bench-load-host");
        let process = daemon
            .leash_as(
                USER_A,
                &cgroup,
                &["run", "--grace", "0", "--", "sh", "-c", HOST_TREE],
            )
            .spawn()
            .context("starting a host")?;
        let host = Self { process, cgroup };
        // The root runs only once registered (the client holds it before exec).
        if !wait_for(cap, || host.grown()) {
            return Ok(None);
        }
        let took = ms(started.elapsed());
        Ok(Some((host, took)))
    }

    fn grown(&self) -> bool {
        let procs = self.cgroup.procs();
        let sleeping = procs
            .iter()
            .filter(|&&pid| comm(pid).as_deref() == Some("sleep"))
            .count();
        procs.len() == HOST_PROCESSES && sleeping == HOST_PROCESSES - 1
    }

    /// SIGKILLs the host; the time until its cgroup is `populated 0` in ms (polled every
    /// 100 µs), None past `cap`.
    fn kill_and_time(mut self, cap: Duration) -> Result<Option<f64>> {
        let events = self.cgroup.procs_file().with_file_name("cgroup.events");
        let started = Instant::now();
        self.process.kill()?;
        self.process.wait()?;
        while started.elapsed() < cap {
            if fs::read_to_string(&events)?.contains("populated 0") {
                return Ok(Some(ms(started.elapsed())));
            }
            thread::sleep(Duration::from_micros(100));
        }
        Ok(None)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A fan of sleeping processes of `uid`, untracked until someone registers its root, in a
/// cgroup of its own. Dropping it kills the group and reaps the root.
struct Fan {
    root: Child,
    cgroup: Cgroup,
}

impl Fan {
    fn start(forker: &Path, n: usize, uid: u32) -> Result<Self> {
        let cgroup = Cgroup::new("bench-load-fan");
        let mut root = fan(forker, &cgroup, n, Some(uid))
            .spawn()
            .context("starting a fan")?;
        let ready = wait_ready(&mut root);
        let fan = Self { root, cgroup };
        ready?;
        Ok(fan)
    }
}

impl Drop for Fan {
    fn drop(&mut self) {
        let _ = cgroup_kill(&self.cgroup);
        let _ = self.root.kill();
        let _ = self.root.wait();
    }
}

/// The daemon's resident memory, sampled every [`RSS_EVERY`] on a thread of its own; past
/// [`RSS_SAFETY_KIB`] it kills the flooder.
struct RssWatch {
    done: Arc<AtomicBool>,
    tripped: Arc<AtomicBool>,
    sampler: Option<thread::JoinHandle<u64>>,
}

impl RssWatch {
    fn start(daemon: u32, flooder: Option<&Flooder>) -> Result<Self> {
        // Opened now, while the flooder is this program's unreaped child: it names that
        // process for good.
        let flooder = flooder.map(|f| Pidfd::open(f.pid())).transpose()?;
        let (done, tripped) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let sampler = {
            let (done, tripped) = (done.clone(), tripped.clone());
            thread::spawn(move || {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    let kib = rss_kib(daemon).unwrap_or(0);
                    peak = peak.max(kib);
                    if kib > RSS_SAFETY_KIB && !tripped.swap(true, Ordering::Relaxed) {
                        eprintln!(
                            "the daemon's RSS passed {} MiB: the flood is stopped",
                            RSS_SAFETY_KIB >> 10
                        );
                        if let Some(flooder) = &flooder {
                            let _ = flooder.send_signal(9);
                        }
                    }
                    thread::sleep(RSS_EVERY);
                }
                peak
            })
        };
        Ok(Self {
            done,
            tripped,
            sampler: Some(sampler),
        })
    }

    fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }

    /// The peak RSS seen, in KiB.
    fn stop(mut self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        self.sampler
            .take()
            .map_or(0, |sampler| sampler.join().unwrap_or(0))
    }
}

impl Drop for RssWatch {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let Some(kib) = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
    else {
        bail!("no VmRSS for process {pid}");
    };
    Ok(kib)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The nearest-rank percentile `p` of `values`.
fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn latency(value: f64) -> String {
    if value < 100.0 {
        f2(value)
    } else {
        format!("{value:.0}")
    }
}

fn write_report(plan: &Plan, conditions: &[Condition], report: &mut Report) {
    report.section(
        "6. Enforcement under hostile load",
        &format!(
            "A host of uid {USER_A} (`leash run --grace 0` of a shell with four children) is \
             SIGKILLed; timed is the wait until its cgroup is `populated 0`, polled every \
             100 µs. Meanwhile uid {USER_B}, not root (root is exempt from per-uid limits), \
             loads the daemon from one process: 1000 connections pipelining `status` and \
             reading the replies; the same with `list` while it holds a tree of {LISTED_TREE} \
             sleeping processes; 1000 connections pipelining `list` (the same tree held) that \
             never read a reply; registering an existing tree of {} processes, then releasing \
             it, {} times (the tree's root runs as uid {USER_B}, its children as root: a user \
             here may not have 100k processes). Each load gets a daemon of its own, past a \
             first untimed kill. The hosts are registered before the load starts (in batches, \
             idle) and killed one by one under it: {} idle; under a flood, up to {} while the next would end within \
             {} s of the flood's start if it took as long as the longest so far; during an \
             adoption, up to {} from {} ms after its request until its reply. A kill that does not end within {} s counts at \
             that cap. Ratios are of medians from this run. Also measured under each load: how \
             long a new host takes to get its tree (given up after {} s), and, once the flood's \
             process is gone, how long the daemon takes to answer a new client's `status` \
             (given up after {} s).",
            plan.scale,
            plan.load_adoptions,
            plan.load_idle_trials,
            plan.load_trials,
            plan.load_budget.as_secs(),
            plan.load_trials,
            ms(ADOPTION_HEAD_START),
            plan.load_cap.as_secs(),
            plan.load_wait.as_secs(),
            plan.load_wait.as_secs(),
        ),
    );
    let capped_at = |cap: Duration| {
        move |value: Option<f64>| match value {
            Some(value) => latency(value),
            None => format!("> {}", latency(ms(cap))),
        }
    };
    let idle = median(&conditions[0].kills.ms);
    let (mut worst_ratio, mut worst_censored) = (f64::NAN, false);
    let mut rows = Vec::new();
    for (i, condition) in conditions.iter().enumerate() {
        let kills = &condition.kills;
        let m = median(&kills.ms);
        let at_cap = |v: f64| {
            let text = latency(v);
            if kills.capped > 0 && v >= ms(plan.load_cap) {
                format!("≥ {text}")
            } else {
                text
            }
        };
        let mut count = kills.ms.len().to_string();
        if kills.capped > 0 {
            count.push_str(&format!(" ({} at the cap)", kills.capped));
        }
        // A median at the cap is only a lower bound, and so is its ratio.
        let censored = kills.capped > 0 && m >= ms(plan.load_cap);
        let ratio = if i == 0 {
            "1 (reference)".to_owned()
        } else {
            if worst_ratio.is_nan() || m / idle > worst_ratio {
                (worst_ratio, worst_censored) = (m / idle, censored);
            }
            format!(
                "{}{} {}",
                if censored { "≥ " } else { "" },
                f1(m / idle),
                verdict(m / idle <= LATENCY_GOAL)
            )
        };
        rows.push(vec![
            condition.name.clone(),
            count,
            at_cap(m),
            if kills.ms.len() >= 10 {
                at_cap(percentile(&kills.ms, 0.9))
            } else {
                "-".into()
            },
            at_cap(kills.ms.iter().copied().fold(f64::NAN, f64::max)),
            ratio,
            if i + 1 == conditions.len() {
                "-".into()
            } else {
                capped_at(plan.load_wait)(condition.registration)
            },
            if i == 0 {
                "-".into()
            } else {
                capped_at(plan.load_wait)(condition.recovery)
            },
        ]);
    }
    report.table(
        &[
            "load (uid 61002)",
            "kills",
            "median (ms)",
            "p90 (ms)",
            "max (ms)",
            "median / idle",
            "a new host's tree in (ms)",
            "answers again after the flood (ms)",
        ],
        &rows,
    );
    report.line(&format!(
        "Kill latency under load ≤ {LATENCY_GOAL} × idle: worst {}{} × idle {}.",
        if worst_censored { "≥ " } else { "" },
        f1(worst_ratio),
        verdict(worst_ratio <= LATENCY_GOAL)
    ));

    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            let memory = &c.memory;
            let after = memory.after_kib as f64 / memory.before_kib as f64;
            let peak = mib(memory.peak_kib);
            vec![
                c.name.clone(),
                f1(mib(memory.before_kib)),
                if memory.stopped {
                    format!("> {} (flood stopped)", RSS_SAFETY_KIB >> 10)
                } else {
                    f1(peak)
                },
                f1(mib(memory.after_kib)),
                f2(after),
                format!(
                    "peak {}, after {}",
                    verdict(peak <= PEAK_GOAL_MIB && !memory.stopped),
                    verdict(after <= AFTER_GOAL)
                ),
            ]
        })
        .collect();
    report.line(&format!(
        "The daemon's memory (VmRSS): before the load (uid {USER_B}'s tree held, the timed hosts \
         registered), its peak sampled every 50 ms under it, and {} s after the flood's process \
         is gone. Goals: ≤ {PEAK_GOAL_MIB} MiB under load, and back within 10% of before after \
         it.",
        SETTLE_AFTER.as_secs_f64()
    ));
    report.table(
        &[
            "load",
            "RSS before (MiB)",
            "peak (MiB)",
            "after (MiB)",
            "after / before",
            "goals",
        ],
        &rows,
    );

    let or_unread = |n: Option<u64>| n.map_or_else(|| "not read".to_owned(), |n| n.to_string());
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .skip(1)
        .map(|c| match &c.tally {
            Some(t) => vec![
                c.name.clone(),
                t.connections.to_string(),
                (t.connect_failed + t.refused_connections).to_string(),
                t.closed_by_daemon.to_string(),
                t.sent.to_string(),
                or_unread(t.answered),
                or_unread(t.refused),
                or_unread(t.other_errors),
            ],
            None => {
                let mut row = vec![c.name.clone()];
                row.extend(std::iter::repeat_n("-".to_owned(), 6));
                row.push("(the flooder was stopped)".into());
                row
            }
        })
        .collect();
    report.line(&format!(
        "What uid {USER_B}'s clients got. A refused connection failed to connect, or was closed \
         by the daemon before any of its requests was answered; a refused request got \
         `limit_reached`. Requests in flight when the flood stopped have no outcome.",
    ));
    report.table(
        &[
            "load",
            "connections",
            "refused",
            "closed by the daemon later",
            "requests sent",
            "answered",
            "refused (`limit_reached`)",
            "other errors",
        ],
        &rows,
    );
    for note in conditions.iter().flat_map(|c| &c.notes) {
        report.line(note);
    }
}
