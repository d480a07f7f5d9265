//! The Prometheus text exposition format, version 0.0.4: what `GET /metrics` answers. Each
//! family is a `# HELP` line, a `# TYPE` line and its samples, one per line:
//!
//! ```text
//! # HELP leash_kills_total Kills started, by reason.
//! # TYPE leash_kills_total counter
//! leash_kills_total{reason="request"} 3
//! ```
//!
//! HELP text escapes `\` and newlines; label values escape `\`, `"` and newlines. A histogram
//! is its cumulative `_bucket` samples (the last `le="+Inf"`), `_sum` and `_count`. Names are
//! the daemon's own constants, checked here in debug builds (and by the tests, with a real
//! parser and `promtool`).

use std::fmt::Write;

/// The `Content-Type` of a response in this format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A sample's value: counts exactly as integers, the rest as floats.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Count(u64),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Float(x) if x.is_nan() => f.write_str("NaN"),
            Self::Float(x) if x == f64::INFINITY => f.write_str("+Inf"),
            Self::Float(x) if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            // Rust writes every finite float in plain decimal (no exponent), which the
            // format's parsers (Go's ParseFloat, Python's float) all read.
            Self::Float(x) => write!(f, "{x}"),
        }
    }
}

/// What a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// A histogram as it is exposed: `counts[i]` observations fell in the `i`th bucket (at most
/// `bounds[i]`, above the bound before), and `counts[bounds.len()]` above the last bound.
#[derive(Clone, Debug, PartialEq)]
pub struct HistogramValues<'a> {
    pub bounds: &'a [f64],
    pub counts: &'a [u64],
    pub sum: f64,
}

/// A text in the exposition format, written one family at a time.
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// A family of one sample without labels.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: Value) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A family of one sample per value of the label `label`.
    pub fn labelled(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        label: &str,
        samples: &[(&str, Value)],
    ) {
        self.family(name, kind, help);
        for &(label_value, value) in samples {
            self.sample(name, &[(label, label_value)], value);
        }
    }

    /// A histogram family: cumulative buckets, then the sum and the count (the count is the
    /// buckets' total, so the `+Inf` bucket and `_count` always agree).
    pub fn histogram(&mut self, name: &str, help: &str, values: &HistogramValues<'_>) {
        debug_assert_eq!(values.counts.len(), values.bounds.len() + 1, "{name}");
        self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        let mut cumulative: u64 = 0;
        for (i, &count) in values.counts.iter().enumerate() {
            cumulative = cumulative.saturating_add(count);
            // Above the last bound: `+Inf`.
            let bound = values.bounds.get(i).copied().unwrap_or(f64::INFINITY);
            let le = Value::Float(bound).to_string();
            self.sample(&bucket, &[("le", &le)], Value::Count(cumulative));
        }
        self.sample(&format!("{name}_sum"), &[], Value::Float(values.sum));
        self.sample(&format!("{name}_count"), &[], Value::Count(cumulative));
    }

    /// The text, ending with a newline.
    pub fn finish(self) -> String {
        self.text
    }

    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(is_metric_name(name), "metric name {name:?}");
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.as_str());
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: Value) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, label_value)) in labels.iter().enumerate() {
                debug_assert!(is_label_name(label), "label name {label:?}");
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"{}\"", escape_label_value(label_value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `[a-zA-Z_][a-zA-Z0-9_]*`, and not starting with `__` (reserved).
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    !name.starts_with("__")
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn escape_help(text: &str) -> String {
    text.replace('\\', r"\\").replace('\n', r"\n")
}

fn escape_label_value(text: &str) -> String {
    text.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_and_a_counter() {
        let mut text = Exposition::new();
        text.single("leash_trees", Kind::Gauge, "Trees now.", Value::Count(3));
        text.single(
            "leash_events_dropped_total",
            Kind::Counter,
            "Events dropped.",
            Value::Count(0),
        );
        assert_eq!(
            text.finish(),
            "# HELP leash_trees Trees now.\n\
             # TYPE leash_trees gauge\n\
             leash_trees 3\n\
             # HELP leash_events_dropped_total Events dropped.\n\
             # TYPE leash_events_dropped_total counter\n\
             leash_events_dropped_total 0\n"
        );
    }

    #[test]
    fn labelled_samples() {
        let mut text = Exposition::new();
        text.labelled(
            "leash_kills_total",
            Kind::Counter,
            "Kills.",
            "reason",
            &[
                ("request", Value::Count(2)),
                ("root_exited", Value::Count(0)),
            ],
        );
        assert_eq!(
            text.finish(),
            "# HELP leash_kills_total Kills.\n\
             # TYPE leash_kills_total counter\n\
             leash_kills_total{reason=\"request\"} 2\n\
             leash_kills_total{reason=\"root_exited\"} 0\n"
        );
    }

    #[test]
    fn help_and_label_values_are_escaped() {
        let mut text = Exposition::new();
        text.labelled(
            "x",
            Kind::Gauge,
            "a \\ b\nc \"quoted\"",
            "l",
            &[("back\\slash \"quote\"\nnewline", Value::Count(1))],
        );
        assert_eq!(
            text.finish(),
            "# HELP x a \\\\ b\\nc \"quoted\"\n\
             # TYPE x gauge\n\
             x{l=\"back\\\\slash \\\"quote\\\"\\nnewline\"} 1\n"
        );
    }

    #[test]
    fn a_histogram_is_cumulative_and_its_count_is_the_last_bucket() {
        let mut text = Exposition::new();
        text.histogram(
            "leash_kill_duration_seconds",
            "Kill time.",
            &HistogramValues {
                bounds: &[0.001, 0.5, 10.0],
                counts: &[1, 0, 2, 4],
                sum: 31.25,
            },
        );
        assert_eq!(
            text.finish(),
            "# HELP leash_kill_duration_seconds Kill time.\n\
             # TYPE leash_kill_duration_seconds histogram\n\
             leash_kill_duration_seconds_bucket{le=\"0.001\"} 1\n\
             leash_kill_duration_seconds_bucket{le=\"0.5\"} 1\n\
             leash_kill_duration_seconds_bucket{le=\"10\"} 3\n\
             leash_kill_duration_seconds_bucket{le=\"+Inf\"} 7\n\
             leash_kill_duration_seconds_sum 31.25\n\
             leash_kill_duration_seconds_count 7\n"
        );
    }

    #[test]
    fn values_are_written_as_the_format_reads_them() {
        let written = |v| Value::to_string(&v);
        assert_eq!(written(Value::Count(u64::MAX)), "18446744073709551615");
        assert_eq!(written(Value::Float(0.0025)), "0.0025");
        assert_eq!(written(Value::Float(1.0)), "1");
        assert_eq!(written(Value::Float(1e-9)), "0.000000001");
        assert_eq!(written(Value::Float(f64::INFINITY)), "+Inf");
        assert_eq!(written(Value::Float(f64::NEG_INFINITY)), "-Inf");
        assert_eq!(written(Value::Float(f64::NAN)), "NaN");
    }

    #[test]
    fn names() {
        for good in ["leash_trees", "a:b_c9", "_x"] {
            assert!(is_metric_name(good), "{good}");
        }
        for bad in ["", "9x", "a-b", "a b", "é"] {
            assert!(!is_metric_name(bad), "{bad}");
        }
        for good in ["reason", "code", "_x", "le"] {
            assert!(is_label_name(good), "{good}");
        }
        for bad in ["", "__name__", "a:b", "9"] {
            assert!(!is_label_name(bad), "{bad}");
        }
    }
}
