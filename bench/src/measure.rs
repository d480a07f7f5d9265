//! Medians, ratios and the markdown report.

use std::{fmt::Write, fs, time::Duration};

use crate::Plan;

pub(crate) fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// The median of per-repetition ratios a/b (each ratio from one repetition's alternating pair).
pub(crate) fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&ratios)
}

pub(crate) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The report, section by section.
pub(crate) struct Report {
    text: String,
}

impl Report {
    pub(crate) fn new(plan: &Plan) -> Self {
        let mut text = String::from("# leash benchmarks\n\n");
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let memory = fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        let _ = writeln!(
            text,
            "Machine: {cores} cores ({cpu}), {}, Linux {}. Run: `cargo xtask bench{}` ({} mode).\n",
            memory
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" "),
            kernel.trim(),
            if plan.quick { " --quick" } else { "" },
            if plan.quick { "quick" } else { "full" },
        );
        // Other work on the machine skews every figure: say how busy it was as the run began.
        let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load: Vec<&str> = load.split_whitespace().take(3).collect();
        let _ = writeln!(
            text,
            "Load average as the run began (1, 5, 15 min): {}{}.\n",
            load.join(", "),
            if load
                .first()
                .and_then(|l| l.parse::<f64>().ok())
                .unwrap_or(0.0)
                > 0.5
            {
                ": the machine was not quiet, and every figure below is slower for it"
            } else {
                ": quiet"
            }
        );
        text.push_str(
            "Every figure is a median over repetitions; every ratio is the median of per-repetition \
             ratios, the variants alternating within a repetition. These machines are shared and \
             noisy: compare within a table, not across runs.\n\n",
        );
        Self { text }
    }

    pub(crate) fn section(&mut self, title: &str, intro: &str) {
        let _ = write!(self.text, "## {title}\n\n{intro}\n\n");
    }

    pub(crate) fn table(&mut self, header: &[&str], rows: &[Vec<String>]) {
        let _ = writeln!(self.text, "| {} |", header.join(" | "));
        let _ = writeln!(self.text, "|{}", "---|".repeat(header.len()));
        for row in rows {
            let _ = writeln!(self.text, "| {} |", row.join(" | "));
        }
        self.text.push('\n');
    }

    pub(crate) fn line(&mut self, line: &str) {
        let _ = writeln!(self.text, "{line}\n");
        eprintln!("{line}");
    }

    pub(crate) fn finish(&mut self, took: Duration) {
        let _ = writeln!(
            self.text,
            "---\nThe whole run took {:.0} s. Reproduce: as root, `cargo xtask bench` (or `--quick`).",
            took.as_secs_f64()
        );
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

pub(crate) fn f1(value: f64) -> String {
    format!("{value:.1}")
}

pub(crate) fn f2(value: f64) -> String {
    format!("{value:.2}")
}

pub(crate) fn f3(value: f64) -> String {
    format!("{value:.3}")
}
