//! The counters, the readings and their text.

use std::ops::Deref;

use super::*;

/// The counters as numbers, for the tests of the modules that count into them.
#[derive(Debug, PartialEq)]
pub(in crate::daemon) struct Counted {
    pub trees_registered: u64,
    /// Per [`KillReason::ALL`].
    pub kills: Vec<u64>,
    pub kill_failures: u64,
    /// Per [`ErrorCode::ALL`].
    pub refused: Vec<u64>,
    pub events_dropped: u64,
}

impl Metrics {
    pub(in crate::daemon) fn counted(&self) -> Counted {
        Counted {
            trees_registered: self.trees_registered.get(),
            kills: (KillReason::ALL.iter())
                .map(|&reason| count(self.kills.get(&reason.into())))
                .collect(),
            kill_failures: self.kill_failures.get(),
            refused: (ErrorCode::ALL.iter())
                .map(|&code| count(self.refused.get(&code.into())))
                .collect(),
            events_dropped: self.events_dropped.get(),
        }
    }

    /// The text of a scrape with nothing read but the counters.
    fn text(&self) -> String {
        self.encode(&Readings::default())
    }
}

/// A family's counter, 0 if it has none.
fn count(counter: Option<impl Deref<Target = Counter>>) -> u64 {
    counter.map_or(0, |counter| counter.get())
}

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

/// Readings with every part read, so that every family is in their text.
fn every_reading() -> Readings {
    Readings {
        membership: "layered",
        kernel: Some(KernelCounters {
            program_skips: vec![("leash_fork", 0)],
            ..KernelCounters::default()
        }),
        process: Some(ProcessFigures::default()),
        ..Readings::default()
    }
}

/// The families of a scrape, with their types, in their order: what dashboards and alerts
/// are written against.
#[test]
fn the_families_are_named_and_typed_as_ever() {
    let text = Metrics::default().encode(&every_reading());
    let types: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .collect();
    assert_eq!(types, FAMILIES);
}

const FAMILIES: [&str; 24] = [
    "leash_build_info gauge",
    "leash_membership gauge",
    "leash_trees gauge",
    "leash_trees_registered_total counter",
    "leash_trees_capacity gauge",
    "leash_members gauge",
    "leash_members_capacity gauge",
    "leash_leases gauge",
    "leash_kills_total counter",
    "leash_kill_failures_total counter",
    "leash_kill_duration_seconds histogram",
    "leash_requests_refused_total counter",
    "leash_events_dropped_total counter",
    "leash_kernel_events_dropped_total counter",
    "leash_member_inserts_failed_total counter",
    "leash_members_reconciled_total counter",
    "leash_forks_refused_total counter",
    "leash_program_skips_total counter",
    "process_cpu_seconds_total counter",
    "process_open_fds gauge",
    "process_max_fds gauge",
    "process_virtual_memory_bytes gauge",
    "process_resident_memory_bytes gauge",
    "process_start_time_seconds gauge",
];

#[test]
fn kills_are_counted_by_reason() {
    let metrics = Metrics::default();
    metrics.kill_started(KillReason::RootExited);
    metrics.kill_started(KillReason::RootExited);
    metrics.kill_started(KillReason::Request);
    let text = metrics.text();
    assert_eq!(
        value_of(&text, r#"leash_kills_total{reason="root_exited"}"#).as_deref(),
        Some("2")
    );
    assert_eq!(
        value_of(&text, r#"leash_kills_total{reason="request"}"#).as_deref(),
        Some("1")
    );
}

#[test]
fn every_reason_and_code_is_there_from_the_start_at_0() {
    let text = Metrics::default().text();
    for reason in KillReason::ALL {
        let series = format!(r#"leash_kills_total{{reason="{reason}"}}"#);
        assert_eq!(value_of(&text, &series).as_deref(), Some("0"), "{series}");
    }
    for code in ErrorCode::ALL {
        let series = format!(r#"leash_requests_refused_total{{code="{code}"}}"#);
        assert_eq!(value_of(&text, &series).as_deref(), Some("0"), "{series}");
    }
}

#[test]
fn refusals_are_counted_by_code() {
    let metrics = Metrics::default();
    metrics.refused(ErrorCode::PermissionDenied);
    metrics.refused(ErrorCode::BadRequest);
    metrics.refused(ErrorCode::BadRequest);
    let text = metrics.text();
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
    let text = metrics.text();
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
    let readings = Readings {
        trees: 2,
        trees_capacity: 4096,
        members: 17,
        members_capacity: 131_072,
        leases: 3,
        membership: "marks",
        kernel: Some(KernelCounters {
            events_dropped: 5,
            inserts_failed: 1,
            program_skips: vec![("leash_fork", 36), ("leash_exit", 0)],
            reconciled: 7,
            forks_refused: 2,
        }),
        ..Readings::default()
    };
    let text = Metrics::default().encode(&readings);
    for (series, value) in [
        ("leash_trees", "2"),
        ("leash_trees_capacity", "4096"),
        ("leash_members", "17"),
        ("leash_members_capacity", "131072"),
        ("leash_leases", "3"),
        ("leash_kernel_events_dropped_total", "5"),
        ("leash_member_inserts_failed_total", "1"),
        ("leash_program_skips_total{program=\"leash_fork\"}", "36"),
        ("leash_members_reconciled_total", "7"),
        ("leash_forks_refused_total", "2"),
        ("leash_membership{guarantee=\"marks\"}", "1"),
        ("leash_program_skips_total{program=\"leash_exit\"}", "0"),
        ("leash_events_dropped_total", "0"),
        ("leash_kill_failures_total", "0"),
    ] {
        assert_eq!(value_of(&text, series).as_deref(), Some(value), "{series}");
    }
    // Unread, the kernel's counters are left out rather than shown as 0.
    let text = Metrics::default().text();
    assert!(!text.contains("leash_kernel_events_dropped_total"));
    assert!(!text.contains("leash_member_inserts_failed_total"));
}

#[test]
fn every_family_has_help_and_type_before_its_samples() {
    let text = Metrics::default().encode(&every_reading());
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

#[test]
fn the_text_format_is_prometheus_0_0_4() {
    let metrics = Metrics::default();
    for us in [7_500, 7_500, 60_000_000] {
        metrics.kill_done(Duration::from_micros(us));
    }
    let text = metrics.text();
    // A counter is named with its `_total` in its HELP and TYPE lines as in its samples,
    // and the text has no OpenMetrics `# EOF`.
    assert!(text.contains(
        "# HELP leash_kill_failures_total Kills that gave up on members stuck in the kernel \
         (the tree stays doomed).\n\
         # TYPE leash_kill_failures_total counter\n\
         leash_kill_failures_total 0\n"
    ));
    assert!(!text.contains("EOF"), "{text}");
    // Bounds as Go writes them; cumulative buckets; the sum in seconds.
    assert!(text.contains(
        "# TYPE leash_kill_duration_seconds histogram\n\
         leash_kill_duration_seconds_bucket{le=\"0.001\"} 0\n\
         leash_kill_duration_seconds_bucket{le=\"0.0025\"} 0\n\
         leash_kill_duration_seconds_bucket{le=\"0.005\"} 0\n\
         leash_kill_duration_seconds_bucket{le=\"0.01\"} 2\n"
    ));
    assert!(text.contains(
        "leash_kill_duration_seconds_bucket{le=\"10\"} 2\n\
         leash_kill_duration_seconds_bucket{le=\"+Inf\"} 3\n\
         leash_kill_duration_seconds_sum 60.015\n\
         leash_kill_duration_seconds_count 3\n"
    ));
    assert!(text.starts_with(
        "# HELP leash_build_info The daemon's version, as a label (the value is always 1).\n\
         # TYPE leash_build_info gauge\n\
         leash_build_info{version=\""
    ));
}

#[test]
fn registrations_are_counted() {
    let metrics = Metrics::default();
    let text = metrics.text();
    assert_eq!(
        value_of(&text, "leash_trees_registered_total").as_deref(),
        Some("0")
    );
    metrics.tree_registered();
    metrics.tree_registered();
    let text = metrics.text();
    assert_eq!(
        value_of(&text, "leash_trees_registered_total").as_deref(),
        Some("2")
    );
}

#[test]
fn the_process_families_have_their_standard_names() {
    let readings = Readings {
        process: Some(ProcessFigures {
            cpu_seconds: 1.25,
            open_fds: 12,
            max_fds: 1024.0,
            virtual_memory_bytes: 300 << 20,
            resident_memory_bytes: 50 << 20,
            start_time_seconds: 1_700_000_000.5,
        }),
        ..Readings::default()
    };
    let text = Metrics::default().encode(&readings);
    for (series, kind, value) in [
        ("process_cpu_seconds_total", "counter", "1.25"),
        ("process_open_fds", "gauge", "12"),
        ("process_max_fds", "gauge", "1024.0"),
        ("process_virtual_memory_bytes", "gauge", "314572800"),
        ("process_resident_memory_bytes", "gauge", "52428800"),
        ("process_start_time_seconds", "gauge", "1700000000.5"),
    ] {
        assert_eq!(value_of(&text, series).as_deref(), Some(value), "{series}");
        assert!(
            text.contains(&format!("# TYPE {series} {kind}\n")),
            "{series}: {text}"
        );
    }
    // Unread, they are left out rather than shown as 0.
    assert!(!Metrics::default().text().contains("process_"));
}

#[test]
fn this_process_reads_as_itself() {
    let figures = ProcessFigures::read().unwrap();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let vm_rss_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap();
    // Read at two moments of a running test: close, not equal.
    let rss = figures.resident_memory_bytes as f64;
    let vm_rss = (vm_rss_kib * 1024) as f64;
    assert!(
        (rss - vm_rss).abs() <= vm_rss * 0.25,
        "{rss} against {vm_rss}"
    );
    assert!(figures.virtual_memory_bytes >= figures.resident_memory_bytes);
    assert!(figures.open_fds >= 3 && (figures.open_fds as f64) <= figures.max_fds);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // Started before now, and this day (a test binary does not run for longer).
    assert!(
        figures.start_time_seconds <= now + 1.0 && figures.start_time_seconds > now - 86_400.0,
        "{} against {now}",
        figures.start_time_seconds
    );
    assert!(figures.cpu_seconds >= 0.0);
}
