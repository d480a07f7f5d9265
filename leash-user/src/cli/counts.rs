//! Counts in words, as the commands print them: `1 member`, `3 members`, and what a kill did
//! (`killed in 230 ms: SIGTERM to 12 processes, then SIGKILL to 3`).

use leash_client::KillSummary;

/// `n` and the noun, singular or plural as `n` wants: `1 member`, `0 members`.
pub(super) fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What a kill did, for people: how long until the tree was empty, and the processes sent
/// each signal (SIGTERM to each member at the start, unless the grace was 0; then SIGKILL to
/// those left, and to those born meanwhile: each process is sent each at most once). The
/// rounds themselves are the engine's business.
pub(super) fn kill(summary: &KillSummary) -> String {
    let signals = match (summary.terminated, summary.killed) {
        (0, 0) => "no process left to signal".to_owned(),
        (terminated, 0) => format!(
            "SIGTERM to {}, which ended within the grace",
            count(terminated, "process", "processes")
        ),
        (0, killed) => format!("SIGKILL to {}", count(killed, "process", "processes")),
        (terminated, killed) => format!(
            "SIGTERM to {}, then SIGKILL to {killed}",
            count(terminated, "process", "processes")
        ),
    };
    format!("killed in {}: {signals}", millis(summary.elapsed_ms))
}

/// `4 ms`, `230 ms`, `1.5 s`, `62.0 s`.
fn millis(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use leash_client::protocol::KillReason;

    use super::*;

    fn summary(terminated: u64, killed: u64, elapsed_ms: u64) -> KillSummary {
        KillSummary {
            tree: 3,
            terminated,
            killed,
            rounds: 2,
            elapsed_ms,
            reason: KillReason::Request,
        }
    }

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(1, "member", "members"), "1 member");
        assert_eq!(count(0, "member", "members"), "0 members");
        assert_eq!(count(12, "process", "processes"), "12 processes");
    }

    #[test]
    fn a_kill_says_its_time_and_signals_not_its_rounds() {
        assert_eq!(
            kill(&summary(12, 3, 230)),
            "killed in 230 ms: SIGTERM to 12 processes, then SIGKILL to 3"
        );
        assert_eq!(
            kill(&summary(1, 0, 1500)),
            "killed in 1.5 s: SIGTERM to 1 process, which ended within the grace"
        );
        assert_eq!(
            kill(&summary(0, 1, 4)),
            "killed in 4 ms: SIGKILL to 1 process"
        );
        assert_eq!(
            kill(&summary(0, 0, 0)),
            "killed in 0 ms: no process left to signal"
        );
        assert!(!kill(&summary(12, 3, 230)).contains("round"));
    }
}
