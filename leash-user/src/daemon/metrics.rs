//! The daemon's figures, as `leash daemon --metrics` serves them (see [`crate::daemon::serve::metrics_http`]).
//!
//! What happens (kills, refusals, dropped events) is counted in prometheus-client's counters,
//! families and histogram, bumped where it happens by whichever thread does it. The counters
//! are atomics; a family's are found under a read lock, which a scrape shares (every label
//! set is there from the start, so none is written after); the histogram's lock is held only
//! to add one observation or to copy its buckets. So a scrape hardly delays a kill. Everything
//! else is read when a scrape asks ([`Readings`]): gauges from the daemon's state (its lock
//! held only to copy the tree ids) and from the kernel's per-tree counters through the
//! daemon's [`TrackerView`], the same reads as the `status` request; the kernel's own counters
//! from its stats map. A scrape never goes through the owner thread, so it cannot delay
//! enforcement. The daemon's own process is read then too ([`process`]).
//!
//! [`TrackerView`]: crate::kernel::TrackerView

use std::{hash::Hash, time::Duration};

use leash_client::protocol::{ErrorCode, KillReason};
use prometheus_client::{
    encoding::prometheus_text,
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
        info::Info,
    },
    registry::Registry,
};

mod labels;
mod process;
use labels::{ByCode, ByReason, Guarantee, Program, Version};
pub(super) use process::ProcessFigures;

/// The upper bounds of the kill-duration buckets, in seconds: 1 ms to 10 s. A kill with no
/// grace to wait takes milliseconds; one that waits takes its grace period (2 s by default).
const KILL_DURATION_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The counters of what happened since the daemon started.
#[derive(Debug)]
pub(super) struct Metrics {
    trees_registered: Counter,
    kills: Family<ByReason, Counter>,
    kill_failures: Counter,
    kill_duration: Histogram,
    refused: Family<ByCode, Counter>,
    events_dropped: Counter,
}

impl Default for Metrics {
    /// Every reason and code is there from the start, at 0: a series that appears only once
    /// it counts would read as absent, not 0, to a rate or an alert before then.
    fn default() -> Self {
        Self {
            trees_registered: Counter::default(),
            kills: counters_for(KillReason::ALL.map(ByReason::from)),
            kill_failures: Counter::default(),
            kill_duration: Histogram::new(KILL_DURATION_BOUNDS),
            refused: counters_for(ErrorCode::ALL.map(ByCode::from)),
            events_dropped: Counter::default(),
        }
    }
}

/// A family with a counter at 0 for each of `labels`.
fn counters_for<S: Clone + Hash + Eq>(labels: impl IntoIterator<Item = S>) -> Family<S, Counter> {
    let family = Family::default();
    for label in labels {
        drop(family.get_or_create(&label));
    }
    family
}

impl Metrics {
    /// A `register` request made a tree (not one taken over from a previous daemon).
    pub(super) fn tree_registered(&self) {
        self.trees_registered.inc();
    }

    /// A kill started for `reason` (once per kill: a kill already under way is not counted
    /// again). Any reason counts, whether or not it was there from the start.
    pub(super) fn kill_started(&self, reason: KillReason) {
        self.kills.get_or_create(&reason.into()).inc();
    }

    /// A tree's kill ended with the tree empty, `elapsed` after it was doomed.
    pub(super) fn kill_done(&self, elapsed: Duration) {
        self.kill_duration.observe(elapsed.as_secs_f64());
    }

    /// A kill gave up (members stuck in the kernel).
    pub(super) fn kill_failed(&self) {
        self.kill_failures.inc();
    }

    /// A request was answered with the error `code`.
    pub(super) fn refused(&self, code: ErrorCode) {
        self.refused.get_or_create(&code.into()).inc();
    }

    /// An event did not fit in a subscriber's queue.
    pub(super) fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// The counters and `now` in the Prometheus text format, version 0.0.4 (not OpenMetrics:
    /// no `# EOF`, and a counter's HELP and TYPE name it with its `_total`, as every
    /// Prometheus parser reads it).
    pub(super) fn encode(&self, now: &Readings) -> String {
        let mut registry = Registry::default();
        self.register(&mut registry, now);
        let mut text = String::new();
        // Writing to a String cannot fail, nor can the metrics (they only write).
        let _ = prometheus_text::encode(&mut text, &registry);
        text
    }

    /// Registers every family in `registry`, in the order a scrape shows them (a family's
    /// samples are in no set order, which the text format allows): the counters as handles on
    /// the same atomics, `now` as constants. A registry for one scrape, as the readings are
    /// that scrape's. The registry ends each help text with a period, and adds a counter's
    /// `_total` to its name.
    fn register(&self, registry: &mut Registry, now: &Readings) {
        registry.register(
            // The encoder adds an info's `_info`.
            "leash_build",
            "The daemon's version, as a label (the value is always 1)",
            Info::new(Version {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );
        let membership = Family::<Guarantee, Gauge>::default();
        let guarantee = now.membership;
        membership.get_or_create(&Guarantee { guarantee }).set(1);
        registry.register(
            "leash_membership",
            "The membership guarantee in place, as a label (the value is always 1): marks \
             (exact: an LSM program the kernel never skips marks every member's child) or \
             layered (the fork programs alone, which Linux 7.x can skip)",
            membership,
        );
        registry.register(
            "leash_trees",
            "Trees registered now (those being killed included)",
            ConstGauge::new(now.trees),
        );
        registry.register(
            "leash_trees_registered",
            "Trees registered since the daemon started (not those it took over from a previous \
             daemon)",
            self.trees_registered.clone(),
        );
        registry.register(
            "leash_trees_capacity",
            "Trees that may be registered at once (leash daemon --max-trees)",
            ConstGauge::new(now.trees_capacity),
        );
        registry.register(
            "leash_members",
            "Processes on a leash now, over every tree (the kernel's per-tree counts)",
            ConstGauge::new(now.members),
        );
        registry.register(
            "leash_members_capacity",
            "Processes that may be tracked at once, over every tree (leash daemon --max-members)",
            ConstGauge::new(now.members_capacity),
        );
        registry.register(
            "leash_leases",
            "Leases open now: client connections, and hosts a restarted daemon holds trees for",
            ConstGauge::new(now.leases),
        );
        registry.register(
            "leash_kills",
            "Kills started, by reason, as the protocol names it (a tree nested in a killed one is \
             killed for enclosing_killed)",
            self.kills.clone(),
        );
        registry.register(
            "leash_kill_failures",
            "Kills that gave up on members stuck in the kernel (the tree stays doomed)",
            self.kill_failures.clone(),
        );
        registry.register(
            "leash_kill_duration_seconds",
            "Time from a tree's doom to its last member's exit, grace period included, per tree \
             killed",
            self.kill_duration.clone(),
        );
        registry.register(
            "leash_requests_refused",
            "Requests answered with an error, by the protocol's error code",
            self.refused.clone(),
        );
        registry.register(
            "leash_events_dropped",
            "Events not delivered to a subscriber that read too slowly, once per subscriber",
            self.events_dropped.clone(),
        );
        // Unread, the kernel's counters and the process's figures are left out rather than
        // shown as 0.
        if let Some(kernel) = &now.kernel {
            kernel.register(registry);
        }
        if let Some(process) = &now.process {
            process.register(registry);
        }
    }
}

/// The `Content-Type` of [`Metrics::encode`]'s text: the Prometheus text format, version 0.0.4.
pub(super) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// What one scrape reads, at one time, besides the counters.
#[derive(Debug, Default)]
pub(super) struct Readings {
    /// The membership guarantee in place (`kernel::Membership`'s name).
    pub membership: &'static str,
    pub trees: u64,
    pub trees_capacity: u64,
    pub members: u64,
    pub members_capacity: u64,
    pub leases: u64,
    /// The kernel's counters (None if its stats map could not be read).
    pub kernel: Option<KernelCounters>,
    /// The daemon's own process (None if /proc could not be read).
    pub process: Option<ProcessFigures>,
}

#[derive(Debug, Default)]
pub(super) struct KernelCounters {
    pub events_dropped: u64,
    pub inserts_failed: u64,
    /// Each attached program's `recursion_misses` (see `kernel::ProgramSkips`).
    pub program_skips: Vec<(&'static str, u64)>,
    /// See `kernel::Stats`.
    pub reconciled: u64,
    pub forks_refused: u64,
}

impl KernelCounters {
    /// Registers their families; the kernel's own counters, read as they are.
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "leash_kernel_events_dropped",
            "Records the kernel's event ring buffer had no room for, since the programs were \
             loaded",
            ConstCounter::new(self.events_dropped),
        );
        registry.register(
            "leash_member_inserts_failed",
            "Children the kernel could not track because the member map was full (their trees \
             are killed), since the programs were loaded",
            ConstCounter::new(self.inserts_failed),
        );
        registry.register(
            "leash_members_reconciled",
            "Marked processes put into the member map by the reconciling iterator: forks the \
             fork programs missed, since the programs were loaded",
            ConstCounter::new(self.reconciled),
        );
        registry.register(
            "leash_forks_refused",
            "Forks the task_alloc program refused (a doomed tree's, or a child it could not \
             mark), since the programs were loaded",
            ConstCounter::new(self.forks_refused),
        );
        let skips = Family::<Program, Counter>::default();
        for &(program, n) in &self.program_skips {
            skips.get_or_create(&Program { program }).inc_by(n);
        }
        registry.register(
            "leash_program_skips",
            "Times the kernel skipped a program rather than run it, by program, since it was \
             loaded (its recursion_misses: a kernel that runs tracepoint programs preemptibly \
             skips one on a CPU where a preempted task is inside it)",
            skips,
        );
    }
}

#[cfg(test)]
mod tests;
