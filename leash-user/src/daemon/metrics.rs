//! The daemon's figures, as `leash daemon --metrics` serves them (see [`super::metrics_http`]).
//!
//! Counters of what happens (kills, refusals, dropped events) are atomics, bumped where it
//! happens by whichever thread does it; nothing waits on them. Everything else is read when a
//! scrape asks: gauges from the daemon's state (its lock held only to copy the tree ids) and
//! from the kernel's per-tree counters through the daemon's [`TrackerView`], the same reads as
//! the `status` request; the kernel's own counters from its stats map. A scrape never goes
//! through the owner thread, so it cannot delay enforcement.
//!
//! [`TrackerView`]: crate::kernel::TrackerView

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use leash_client::protocol::ErrorCode;

use super::{
    metrics_text::{Exposition, HistogramValues, Kind, Value},
    shared::Daemon,
};

/// Why a tree is killed, in the protocol's words (`kill_started` events, the `killed`
/// summary): the label values of `leash_kills_total`.
pub const KILL_REASONS: [&str; 8] = [
    "request",
    "root_exited",
    "lease_ended",
    "untrackable",
    "member_quota",
    "enclosing_killed",
    "shutdown",
    "resumed",
];

/// The label value of a kill whose reason is not in [`KILL_REASONS`] (none is expected: a new
/// reason belongs there).
const OTHER_REASON: &str = "other";

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
pub const KILL_DURATION_BOUNDS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The counters of what happened since the daemon started.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Per [`KILL_REASONS`], then [`OTHER_REASON`].
    kills: [AtomicU64; KILL_REASONS.len() + 1],
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
    /// A kill started for `reason` (once per kill: a kill already under way is not counted
    /// again).
    pub fn kill_started(&self, reason: &str) {
        let index = KILL_REASONS
            .iter()
            .position(|&known| known == reason)
            .unwrap_or(KILL_REASONS.len());
        self.kills[index].fetch_add(1, Ordering::Relaxed);
    }

    /// A tree's kill ended with the tree empty, `elapsed` after it was doomed.
    pub fn kill_done(&self, elapsed: Duration) {
        self.kill_duration.observe(elapsed);
    }

    /// A kill gave up (members stuck in the kernel).
    pub fn kill_failed(&self) {
        self.kill_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was answered with the error `code`.
    pub fn refused(&self, code: ErrorCode) {
        self.refused[code_index(code)].fetch_add(1, Ordering::Relaxed);
    }

    /// An event did not fit in a subscriber's queue.
    pub fn event_dropped(&self) {
        self.events_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now, in a snapshot whose other figures are left at 0.
    pub fn counted(&self) -> Snapshot {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Snapshot {
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
pub struct Snapshot {
    pub trees: u64,
    pub trees_capacity: u64,
    pub members: u64,
    pub members_capacity: u64,
    pub leases: u64,
    pub kills: [u64; KILL_REASONS.len() + 1],
    pub kill_failures: u64,
    pub kill_duration_counts: [u64; KILL_DURATION_BOUNDS.len() + 1],
    pub kill_duration_sum: Duration,
    pub refused: [u64; ERROR_CODES.len()],
    pub events_dropped: u64,
    /// The kernel's counters (None if its stats map could not be read).
    pub kernel: Option<KernelCounters>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub events_dropped: u64,
    pub inserts_failed: u64,
}

/// Reads the figures now. Reads the kernel's maps (two lookups per tree): call it on a
/// blocking thread.
pub fn snapshot(daemon: &Daemon) -> Snapshot {
    // The registry's lock is held to copy the ids, as for `status`; the maps are read after.
    let (trees, leases) = (daemon.registry.trees(), daemon.registry.lease_count());
    let view = &daemon.view;
    let members = view.members_of(&trees);
    let capacity = view.capacity();
    let kernel = view.stats().ok().map(|stats| KernelCounters {
        events_dropped: stats.events_dropped,
        inserts_failed: stats.inserts_failed,
    });
    Snapshot {
        trees: trees.len() as u64,
        trees_capacity: capacity.trees.into(),
        members,
        members_capacity: capacity.members.into(),
        leases: leases as u64,
        kernel,
        ..daemon.metrics.counted()
    }
}

/// The snapshot in the Prometheus text format.
pub fn encode(snapshot: &Snapshot) -> String {
    use Kind::{Counter, Gauge};
    let count = Value::Count;
    let mut text = Exposition::new();
    text.labelled(
        "leash_build_info",
        Gauge,
        "The daemon's version, as a label (the value is always 1).",
        "version",
        &[(env!("CARGO_PKG_VERSION"), count(1))],
    );
    text.single(
        "leash_trees",
        Gauge,
        "Trees registered now (those being killed included).",
        count(snapshot.trees),
    );
    text.single(
        "leash_trees_capacity",
        Gauge,
        "Trees that may be registered at once (leash daemon --max-trees).",
        count(snapshot.trees_capacity),
    );
    text.single(
        "leash_members",
        Gauge,
        "Processes on a leash now, over every tree (the kernel's per-tree counts).",
        count(snapshot.members),
    );
    text.single(
        "leash_members_capacity",
        Gauge,
        "Processes that may be tracked at once, over every tree (leash daemon --max-members).",
        count(snapshot.members_capacity),
    );
    text.single(
        "leash_leases",
        Gauge,
        "Leases open now: client connections, and hosts a restarted daemon holds trees for.",
        count(snapshot.leases),
    );
    let mut kills: Vec<(&str, Value)> = KILL_REASONS
        .iter()
        .zip(snapshot.kills)
        .map(|(&reason, n)| (reason, count(n)))
        .collect();
    let other = snapshot.kills[KILL_REASONS.len()];
    if other > 0 {
        kills.push((OTHER_REASON, count(other)));
    }
    text.labelled(
        "leash_kills_total",
        Counter,
        "Kills started, by reason, as the protocol names it (a tree nested in a killed one is \
         killed for enclosing_killed).",
        "reason",
        &kills,
    );
    text.single(
        "leash_kill_failures_total",
        Counter,
        "Kills that gave up on members stuck in the kernel (the tree stays doomed).",
        count(snapshot.kill_failures),
    );
    text.histogram(
        "leash_kill_duration_seconds",
        "Time from a tree's doom to its last member's exit, grace period included, per tree \
         killed.",
        &HistogramValues {
            bounds: &KILL_DURATION_BOUNDS,
            counts: &snapshot.kill_duration_counts,
            sum: snapshot.kill_duration_sum.as_secs_f64(),
        },
    );
    let codes: Vec<String> = ERROR_CODES.iter().map(ToString::to_string).collect();
    let refused: Vec<(&str, Value)> = codes
        .iter()
        .zip(snapshot.refused)
        .map(|(code, n)| (code.as_str(), count(n)))
        .collect();
    text.labelled(
        "leash_requests_refused_total",
        Counter,
        "Requests answered with an error, by the protocol's error code.",
        "code",
        &refused,
    );
    text.single(
        "leash_events_dropped_total",
        Counter,
        "Events not delivered to a subscriber that read too slowly, once per subscriber.",
        count(snapshot.events_dropped),
    );
    if let Some(kernel) = snapshot.kernel {
        text.single(
            "leash_kernel_events_dropped_total",
            Counter,
            "Records the kernel's event ring buffer had no room for, since the programs were \
             loaded.",
            count(kernel.events_dropped),
        );
        text.single(
            "leash_member_inserts_failed_total",
            Counter,
            "Children the kernel could not track because the member map was full (their trees \
             are killed), since the programs were loaded.",
            count(kernel.inserts_failed),
        );
    }
    text.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample lines of `text` (not comments), as (series, value).
    fn samples(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                (series.to_owned(), value.to_owned())
            })
            .collect()
    }

    fn value_of(text: &str, series: &str) -> Option<String> {
        samples(text)
            .into_iter()
            .find(|(s, _)| s == series)
            .map(|(_, v)| v)
    }

    #[test]
    fn error_codes_are_in_their_places() {
        for (i, &code) in ERROR_CODES.iter().enumerate() {
            assert_eq!(code_index(code), i, "{code}");
        }
    }

    #[test]
    fn kills_are_counted_by_reason() {
        let metrics = Metrics::default();
        metrics.kill_started("root_exited");
        metrics.kill_started("root_exited");
        metrics.kill_started("request");
        let text = encode(&metrics.counted());
        assert_eq!(
            value_of(&text, r#"leash_kills_total{reason="root_exited"}"#).as_deref(),
            Some("2")
        );
        assert_eq!(
            value_of(&text, r#"leash_kills_total{reason="request"}"#).as_deref(),
            Some("1")
        );
        // Every reason is there from the start, at 0; "other" only once it happened.
        for reason in KILL_REASONS {
            assert!(
                value_of(&text, &format!(r#"leash_kills_total{{reason="{reason}"}}"#)).is_some(),
                "{reason}"
            );
        }
        assert!(!text.contains(r#"reason="other""#));
        metrics.kill_started("something_new");
        let text = encode(&metrics.counted());
        assert_eq!(
            value_of(&text, r#"leash_kills_total{reason="other"}"#).as_deref(),
            Some("1")
        );
    }

    #[test]
    fn refusals_are_counted_by_code() {
        let metrics = Metrics::default();
        metrics.refused(ErrorCode::PermissionDenied);
        metrics.refused(ErrorCode::BadRequest);
        metrics.refused(ErrorCode::BadRequest);
        let text = encode(&metrics.counted());
        let refused = |code: &str| {
            value_of(
                &text,
                &format!(r#"leash_requests_refused_total{{code="{code}"}}"#),
            )
        };
        assert_eq!(refused("bad_request").as_deref(), Some("2"));
        assert_eq!(refused("permission_denied").as_deref(), Some("1"));
        assert_eq!(refused("limit_reached").as_deref(), Some("0"));
        assert_eq!(refused("kill_failed").as_deref(), Some("0"));
    }

    #[test]
    fn kill_durations_fall_in_their_buckets() {
        let metrics = Metrics::default();
        for ms in [0, 1, 2, 700, 2_000, 60_000] {
            metrics.kill_done(Duration::from_millis(ms));
        }
        let text = encode(&metrics.counted());
        let bucket = |le: &str| {
            value_of(
                &text,
                &format!(r#"leash_kill_duration_seconds_bucket{{le="{le}"}}"#),
            )
            .unwrap()
        };
        // 0 and 1 ms are within 1 ms (le: at most).
        assert_eq!(bucket("0.001"), "2");
        assert_eq!(bucket("0.0025"), "3");
        assert_eq!(bucket("0.5"), "3");
        assert_eq!(bucket("1"), "4");
        assert_eq!(bucket("2.5"), "5");
        assert_eq!(bucket("10"), "5");
        assert_eq!(bucket("+Inf"), "6");
        assert_eq!(
            value_of(&text, "leash_kill_duration_seconds_count").as_deref(),
            Some("6")
        );
        assert_eq!(
            value_of(&text, "leash_kill_duration_seconds_sum").as_deref(),
            Some("62.703")
        );
    }

    #[test]
    fn gauges_and_kernel_counters() {
        let snapshot = Snapshot {
            trees: 2,
            trees_capacity: 4096,
            members: 17,
            members_capacity: 131_072,
            leases: 3,
            kernel: Some(KernelCounters {
                events_dropped: 5,
                inserts_failed: 1,
            }),
            ..Snapshot::default()
        };
        let text = encode(&snapshot);
        for (series, value) in [
            ("leash_trees", "2"),
            ("leash_trees_capacity", "4096"),
            ("leash_members", "17"),
            ("leash_members_capacity", "131072"),
            ("leash_leases", "3"),
            ("leash_kernel_events_dropped_total", "5"),
            ("leash_member_inserts_failed_total", "1"),
            ("leash_events_dropped_total", "0"),
            ("leash_kill_failures_total", "0"),
        ] {
            assert_eq!(value_of(&text, series).as_deref(), Some(value), "{series}");
        }
        // Unread, the kernel's counters are left out rather than shown as 0.
        let text = encode(&Snapshot::default());
        assert!(!text.contains("leash_kernel_events_dropped_total"));
        assert!(!text.contains("leash_member_inserts_failed_total"));
    }

    #[test]
    fn every_family_has_help_and_type_before_its_samples() {
        let text = encode(&Snapshot::default());
        let mut declared: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                declared.push((name.to_owned(), kind.to_owned()));
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(!help.is_empty(), "{name}");
            } else {
                let (series, _) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                let (family, kind) = declared.last().expect("a TYPE line first");
                let belongs = name == family
                    || (kind == "histogram"
                        && ["_bucket", "_sum", "_count"]
                            .iter()
                            .any(|suffix| name == format!("{family}{suffix}")));
                assert!(belongs, "{name} after the TYPE of {family}");
                match kind.as_str() {
                    "counter" => assert!(family.ends_with("_total"), "{family}"),
                    _ => assert!(!family.ends_with("_total"), "{family}"),
                }
            }
        }
        assert!(text.ends_with('\n'));
    }
}
