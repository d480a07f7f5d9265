//! The daemon's figures, as `leash daemon --metrics` serves them (see [`super::metrics_http`]).
//!
//! Counters of what happens (kills, refusals, dropped events) are atomics, bumped where it
//! happens by whichever thread does it; nothing waits on them. Everything else is read when a
//! scrape asks: gauges from the daemon's state (its lock held only to copy the tree ids) and
//! from the kernel's per-tree counters through the daemon's [`TrackerView`], the same reads as
//! the `status` request; the kernel's own counters from its stats map. A scrape never goes
//! through the owner thread, so it cannot delay enforcement. The daemon's own process is read
//! then too ([`process`]).
//!
//! [`TrackerView`]: crate::kernel::TrackerView

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use leash_client::protocol::{ErrorCode, KillReason};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

mod process;
pub(super) use process::ProcessFigures;

/// Why a tree is killed (`kill_started` events, the `killed` summary), in the order of their
/// label values in `leash_kills_total`.
pub(super) const KILL_REASONS: [KillReason; 8] = [
    KillReason::Request,
    KillReason::RootExited,
    KillReason::LeaseEnded,
    KillReason::Untrackable,
    KillReason::MemberQuota,
    KillReason::EnclosingKilled,
    KillReason::Shutdown,
    KillReason::Resumed,
];

/// Every error code of the protocol, in the order of [`code_index`]: the label values of
/// `leash_requests_refused_total`.
const ERROR_CODES: [ErrorCode; 8] = [
    ErrorCode::BadRequest,
    ErrorCode::TooLong,
    ErrorCode::UnsupportedVersion,
    ErrorCode::NotFound,
    ErrorCode::PermissionDenied,
    ErrorCode::LimitReached,
    ErrorCode::KillFailed,
    ErrorCode::Internal,
];

/// Where `code` is in [`ERROR_CODES`]. A match, not a search: a new code does not compile
/// until it has its place.
fn code_index(code: ErrorCode) -> usize {
    match code {
        ErrorCode::BadRequest => 0,
        ErrorCode::TooLong => 1,
        ErrorCode::UnsupportedVersion => 2,
        ErrorCode::NotFound => 3,
        ErrorCode::PermissionDenied => 4,
        ErrorCode::LimitReached => 5,
        ErrorCode::KillFailed => 6,
        ErrorCode::Internal => 7,
    }
}

/// The upper bounds of the kill-duration buckets, in seconds: 1 ms to 10 s. A kill with no
/// grace to wait takes milliseconds; one that waits takes its grace period (2 s by default).
pub(super) const KILL_DURATION_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The counters of what happened since the daemon started.
#[derive(Debug, Default)]
pub(super) struct Metrics {
    trees_registered: AtomicU64,
    /// Per [`KILL_REASONS`].
    kills: [AtomicU64; KILL_REASONS.len()],
    kill_failures: AtomicU64,
    kill_duration: Histogram,
    /// Per [`ERROR_CODES`].
    refused: [AtomicU64; ERROR_CODES.len()],
    events_dropped: AtomicU64,
}

/// Observations per bucket of [`KILL_DURATION_BOUNDS`] (not cumulative), the last above them
/// all, and their sum.
#[derive(Debug, Default)]
struct Histogram {
    counts: [AtomicU64; KILL_DURATION_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = KILL_DURATION_BOUNDS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(KILL_DURATION_BOUNDS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Metrics {
    /// A `register` request made a tree (not one taken over from a previous daemon).
    pub(super) fn tree_registered(&self) {
        self.trees_registered.fetch_add(1, Ordering::Relaxed);
    }

    /// A kill started for `reason` (once per kill: a kill already under way is not counted
    /// again).
    pub(super) fn kill_started(&self, reason: KillReason) {
        if let Some(index) = KILL_REASONS.iter().position(|&known| known == reason) {
            self.kills[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A tree's kill ended with the tree empty, `elapsed` after it was doomed.
    pub(super) fn kill_done(&self, elapsed: Duration) {
        self.kill_duration.observe(elapsed);
    }

    /// A kill gave up (members stuck in the kernel).
    pub(super) fn kill_failed(&self) {
        self.kill_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was answered with the error `code`.
    pub(super) fn refused(&self, code: ErrorCode) {
        self.refused[code_index(code)].fetch_add(1, Ordering::Relaxed);
    }

    /// An event did not fit in a subscriber's queue.
    pub(super) fn event_dropped(&self) {
        self.events_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now, in a snapshot whose other figures are left at 0.
    pub(super) fn counted(&self) -> Snapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Snapshot {
            trees_registered: load(&self.trees_registered),
            kills: self.kills.each_ref().map(load),
            kill_failures: load(&self.kill_failures),
            kill_duration_counts: self.kill_duration.counts.each_ref().map(load),
            kill_duration_sum: Duration::from_nanos(load(&self.kill_duration.sum_ns)),
            refused: self.refused.each_ref().map(load),
            events_dropped: load(&self.events_dropped),
            ..Snapshot::default()
        }
    }
}

/// Everything one scrape shows, read at one time.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Snapshot {
    /// The membership guarantee in place (`kernel::Membership`'s name).
    pub membership: &'static str,
    pub trees: u64,
    pub trees_registered: u64,
    pub trees_capacity: u64,
    pub members: u64,
    pub members_capacity: u64,
    pub leases: u64,
    pub kills: [u64; KILL_REASONS.len()],
    pub kill_failures: u64,
    pub kill_duration_counts: [u64; KILL_DURATION_BOUNDS.len() + 1],
    pub kill_duration_sum: Duration,
    pub refused: [u64; ERROR_CODES.len()],
    pub events_dropped: u64,
    /// The kernel's counters (None if its stats map could not be read).
    pub kernel: Option<KernelCounters>,
    /// The daemon's own process (None if /proc could not be read).
    pub process: Option<ProcessFigures>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct KernelCounters {
    pub events_dropped: u64,
    pub inserts_failed: u64,
    /// Each attached program's `recursion_misses` (see `kernel::ProgramSkips`).
    pub program_skips: Vec<(&'static str, u64)>,
    /// See `kernel::Stats`.
    pub reconciled: u64,
    pub forks_refused: u64,
}

/// The `Content-Type` of [`encode`]'s text: the Prometheus text format, version 0.0.4.
pub(super) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The snapshot in the Prometheus text format, version 0.0.4 (not OpenMetrics: no `# EOF`, and
/// a counter's HELP and TYPE name it with its `_total`, as every Prometheus parser reads it).
pub(super) fn encode(snapshot: &Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot.clone()));
    let mut text = String::new();
    // Writing to a String cannot fail, nor can the collector (it only writes).
    let _ = prometheus_text::encode(&mut text, &registry);
    text
}

/// A snapshot is its own collector: the registry built for one scrape asks it once, and it
/// writes its families in this order, each family's samples in the order of its constants.
impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let out = &mut encoder;
        let family = out.encode_descriptor(
            "leash_build_info",
            "The daemon's version, as a label (the value is always 1).",
            None,
            MetricType::Gauge,
        )?;
        let version = env!("CARGO_PKG_VERSION");
        samples(family, "version", [(version, ConstGauge::new(1_u64))])?;
        let family = out.encode_descriptor(
            "leash_membership",
            "The membership guarantee in place, as a label (the value is always 1): marks \
             (exact: an LSM program the kernel never skips marks every member's child) or \
             layered (the fork programs alone, which Linux 7.x can skip).",
            None,
            MetricType::Gauge,
        )?;
        samples(
            family,
            "guarantee",
            [(self.membership, ConstGauge::new(1_u64))],
        )?;
        single(
            out,
            ConstGauge::new(self.trees),
            "leash_trees",
            "Trees registered now (those being killed included).",
        )?;
        single(
            out,
            ConstCounter::new(self.trees_registered),
            "leash_trees_registered",
            "Trees registered since the daemon started (not those it took over from a previous \
             daemon).",
        )?;
        single(
            out,
            ConstGauge::new(self.trees_capacity),
            "leash_trees_capacity",
            "Trees that may be registered at once (leash daemon --max-trees).",
        )?;
        single(
            out,
            ConstGauge::new(self.members),
            "leash_members",
            "Processes on a leash now, over every tree (the kernel's per-tree counts).",
        )?;
        single(
            out,
            ConstGauge::new(self.members_capacity),
            "leash_members_capacity",
            "Processes that may be tracked at once, over every tree (leash daemon --max-members).",
        )?;
        single(
            out,
            ConstGauge::new(self.leases),
            "leash_leases",
            "Leases open now: client connections, and hosts a restarted daemon holds trees for.",
        )?;
        // Every reason from the start, at 0.
        let kills = KILL_REASONS
            .iter()
            .zip(self.kills)
            .map(|(reason, n)| (reason.as_str(), n));
        let family = out.encode_descriptor(
            // The encoder adds `_total` to a counter's name, here and in its samples.
            "leash_kills",
            "Kills started, by reason, as the protocol names it (a tree nested in a killed one is \
             killed for enclosing_killed).",
            None,
            MetricType::Counter,
        )?;
        samples(
            family,
            "reason",
            kills.map(|(reason, n)| (reason, ConstCounter::new(n))),
        )?;
        single(
            out,
            ConstCounter::new(self.kill_failures),
            "leash_kill_failures",
            "Kills that gave up on members stuck in the kernel (the tree stays doomed).",
        )?;
        // Per bucket, not cumulative (the encoder adds them up), the last above every bound;
        // the count is their total, so the `+Inf` bucket and `_count` always agree.
        let buckets: Vec<(f64, u64)> = KILL_DURATION_BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.kill_duration_counts)
            .collect();
        let count = self
            .kill_duration_counts
            .iter()
            .fold(0_u64, |total, &n| total.saturating_add(n));
        out.encode_descriptor(
            "leash_kill_duration_seconds",
            "Time from a tree's doom to its last member's exit, grace period included, per tree \
             killed.",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(
            self.kill_duration_sum.as_secs_f64(),
            count,
            &buckets,
            None,
        )?;
        let codes: Vec<String> = ERROR_CODES.iter().map(ToString::to_string).collect();
        let family = out.encode_descriptor(
            "leash_requests_refused",
            "Requests answered with an error, by the protocol's error code.",
            None,
            MetricType::Counter,
        )?;
        let refused = codes.iter().zip(self.refused);
        samples(
            family,
            "code",
            refused.map(|(code, n)| (code.as_str(), ConstCounter::new(n))),
        )?;
        single(
            out,
            ConstCounter::new(self.events_dropped),
            "leash_events_dropped",
            "Events not delivered to a subscriber that read too slowly, once per subscriber.",
        )?;
        // Unread, the kernel's counters are left out rather than shown as 0.
        if let Some(kernel) = &self.kernel {
            single(
                out,
                ConstCounter::new(kernel.events_dropped),
                "leash_kernel_events_dropped",
                "Records the kernel's event ring buffer had no room for, since the programs \
                 were loaded.",
            )?;
            single(
                out,
                ConstCounter::new(kernel.inserts_failed),
                "leash_member_inserts_failed",
                "Children the kernel could not track because the member map was full (their \
                 trees are killed), since the programs were loaded.",
            )?;
            single(
                out,
                ConstCounter::new(kernel.reconciled),
                "leash_members_reconciled",
                "Marked processes put into the member map by the reconciling iterator: forks \
                 the fork programs missed, since the programs were loaded.",
            )?;
            single(
                out,
                ConstCounter::new(kernel.forks_refused),
                "leash_forks_refused",
                "Forks the task_alloc program refused (a doomed tree's, or a child it could \
                 not mark), since the programs were loaded.",
            )?;
            let family = out.encode_descriptor(
                "leash_program_skips",
                "Times the kernel skipped a program rather than run it, by program, since it \
                 was loaded (its recursion_misses: a kernel that runs tracepoint programs \
                 preemptibly skips one on a CPU where a preempted task is inside it).",
                None,
                MetricType::Counter,
            )?;
            samples(
                family,
                "program",
                kernel
                    .program_skips
                    .iter()
                    .map(|&(program, n)| (program, ConstCounter::new(n))),
            )?;
        }
        if let Some(process) = &self.process {
            encode_process(out, process)?;
        }
        Ok(())
    }
}

/// The standard `process_*` families, with the Go and Python clients' help texts.
fn encode_process(out: &mut DescriptorEncoder, process: &ProcessFigures) -> fmt::Result {
    single(
        out,
        ConstCounter::new(process.cpu_seconds),
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds.",
    )?;
    single(
        out,
        ConstGauge::new(process.open_fds),
        "process_open_fds",
        "Number of open file descriptors.",
    )?;
    single(
        out,
        ConstGauge::new(process.max_fds),
        "process_max_fds",
        "Maximum number of open file descriptors.",
    )?;
    single(
        out,
        ConstGauge::new(process.virtual_memory_bytes),
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
    )?;
    single(
        out,
        ConstGauge::new(process.resident_memory_bytes),
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
    )?;
    single(
        out,
        ConstGauge::new(process.start_time_seconds),
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
    )
}

/// A family of one sample without labels. (A counter's `name` is without its `_total`.)
fn single(
    out: &mut DescriptorEncoder,
    metric: impl EncodeMetric,
    name: &str,
    help: &str,
) -> fmt::Result {
    metric.encode(out.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// The samples of a family: one per (label value, metric).
fn samples<'a>(
    mut family: MetricEncoder,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, impl EncodeMetric)>,
) -> fmt::Result {
    for (value, metric) in samples {
        metric.encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
