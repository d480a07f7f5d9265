//! Accepting connections without a storm. When the daemon is out of file descriptors (or the
//! kernel of memory), accept(2) fails while the connection stays queued and the listener stays
//! readable: retried at once, it fails again at once, for as long as the shortage lasts, and a
//! log line per failure fills the disk. So a shortage is waited out with a pause that doubles
//! (5 ms to 500 ms) and resets on the next success, while a failure that concerns one
//! connection only (it was aborted before it was accepted) is retried at once. Failures are
//! logged at most once every 10 s, with how many there were since the last line.

use std::{
    io,
    time::{Duration, Instant},
};

use tokio::net::{UnixListener, UnixStream};

/// The first pause after a failure for lack of descriptors or memory.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// The pause doubles up to this.
const LONGEST_PAUSE: Duration = Duration::from_millis(500);
/// At most one line about failed accepts per this time.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the accept loop keeps from one connection to the next: the pause it is at and what it
/// has logged. Kept outside [`next_connection`], so that neither resets when the loop waits on
/// something else in between (a signal, say).
#[derive(Debug, Default)]
pub(in crate::daemon) struct AcceptFailures {
    backoff: Backoff,
    log: RateLimit,
}

/// The next connection. Failed accepts are retried, never returned (see the module's doc).
pub(in crate::daemon) async fn next_connection(
    listener: &UnixListener,
    failures: &mut AcceptFailures,
) -> UnixStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                if let Some(count) = failures.succeeded(Instant::now()) {
                    tracing::info!(failures = count, "accepting connections again");
                }
                return stream;
            }
            Err(e) => {
                let (pause, report) = failures.failed(&e, Instant::now());
                if let Some(count) = report {
                    tracing::warn!(
                        failures = count,
                        pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                        "accept failed: {e} ({count} failures since the last report; at most \
                         one report every {LOG_EVERY:?})"
                    );
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

impl AcceptFailures {
    /// An accept failed with `error` at `now`: how long to pause before the next, and the
    /// failure count to report now, if a report is due.
    fn failed(&mut self, error: &io::Error, now: Instant) -> (Duration, Option<u64>) {
        let pause = if concerns_one_connection(error) {
            Duration::ZERO
        } else {
            self.backoff.next_pause()
        };
        (pause, self.log.failed(now))
    }

    /// An accept succeeded at `now`: the pause starts over, and the failures not yet reported
    /// are reported if a report is due.
    fn succeeded(&mut self, now: Instant) -> Option<u64> {
        self.backoff = Backoff::default();
        self.log.recovered(now)
    }
}

/// Whether accept's `error` concerns only the connection it was accepting (which is gone), so
/// the next accept may be tried at once. Anything else is waited out: a shortage of
/// descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), and whatever leaves the connection
/// queued or should never come (EPERM from a security module, which refuses before taking the
/// connection off the queue; a broken listener), which must not make the loop spin either.
fn concerns_one_connection(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ECONNABORTED | libc::EINTR | libc::EPROTO | libc::EAGAIN)
    )
}

/// The pause before retrying after a shortage: 5 ms, doubling to 500 ms.
#[derive(Debug, Default)]
struct Backoff {
    /// The last pause; None when there was none since the last success.
    last: Option<Duration>,
}

impl Backoff {
    fn next_pause(&mut self) -> Duration {
        let pause = self
            .last
            .map_or(FIRST_PAUSE, |last| (last * 2).min(LONGEST_PAUSE));
        self.last = Some(pause);
        pause
    }
}

/// At most one line per [`LOG_EVERY`], counting what happened in between.
#[derive(Debug, Default)]
pub(in crate::daemon) struct RateLimit {
    last_line: Option<Instant>,
    /// Failures since the last line.
    unreported: u64,
}

impl RateLimit {
    /// One more failure: the count to report now, if a line is due.
    pub(in crate::daemon) fn failed(&mut self, now: Instant) -> Option<u64> {
        self.unreported += 1;
        self.is_due(now).then(|| self.report(now))
    }

    /// Accepting works again: the failures not yet reported, if any and a line is due. (If
    /// none is due, they are reported with the next line.)
    fn recovered(&mut self, now: Instant) -> Option<u64> {
        (self.unreported > 0 && self.is_due(now)).then(|| self.report(now))
    }

    fn is_due(&self, now: Instant) -> bool {
        self.last_line
            .is_none_or(|last| now.saturating_duration_since(last) >= LOG_EVERY)
    }

    fn report(&mut self, now: Instant) -> u64 {
        self.last_line = Some(now);
        std::mem::take(&mut self.unreported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os_error(code: i32) -> io::Error {
        io::Error::from_raw_os_error(code)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_shortage_backs_off_doubling_to_half_a_second() {
        let mut failures = AcceptFailures::default();
        let now = Instant::now();
        let pauses: Vec<Duration> = (0..10)
            .map(|_| failures.failed(&os_error(libc::EMFILE), now).0)
            .collect();
        assert_eq!(
            pauses,
            [5, 10, 20, 40, 80, 160, 320, 500, 500, 500].map(ms),
            "EMFILE"
        );
        for code in [libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert_eq!(failures.failed(&os_error(code), now).0, ms(500), "{code}");
        }
    }

    #[test]
    fn a_success_starts_the_pause_over() {
        let mut failures = AcceptFailures::default();
        let now = Instant::now();
        for _ in 0..5 {
            failures.failed(&os_error(libc::EMFILE), now);
        }
        failures.succeeded(now);
        assert_eq!(failures.failed(&os_error(libc::EMFILE), now).0, ms(5));
    }

    #[test]
    fn an_aborted_connection_is_retried_at_once_without_touching_the_pause() {
        let mut failures = AcceptFailures::default();
        let now = Instant::now();
        failures.failed(&os_error(libc::EMFILE), now);
        for code in [libc::ECONNABORTED, libc::EINTR, libc::EPROTO] {
            assert_eq!(failures.failed(&os_error(code), now).0, Duration::ZERO);
        }
        assert_eq!(failures.failed(&os_error(libc::EMFILE), now).0, ms(10));
        // Never expected: waited out like a shortage, so a broken listener cannot spin.
        assert_eq!(failures.failed(&os_error(libc::EBADF), now).0, ms(20));
        assert_eq!(failures.failed(&os_error(libc::EPERM), now).0, ms(40));
        assert_eq!(
            failures.failed(&io::Error::other("no errno"), now).0,
            ms(80)
        );
    }

    #[test]
    fn failures_are_reported_once_per_ten_seconds_with_their_count() {
        let mut failures = AcceptFailures::default();
        let start = Instant::now();
        let emfile = os_error(libc::EMFILE);
        assert_eq!(
            failures.failed(&emfile, start).1,
            Some(1),
            "the first at once"
        );
        // A storm: a failure every millisecond for ten seconds, in silence.
        let mut reports = Vec::new();
        for i in 1..=10_000 {
            if let Some(count) = failures.failed(&emfile, start + ms(i)).1 {
                reports.push((i, count));
            }
        }
        assert_eq!(reports, [(10_000, 10_000)], "one line, counting them all");
        assert_eq!(failures.failed(&emfile, start + ms(10_001)).1, None);
    }

    #[test]
    fn a_recovery_reports_what_was_not_yet_reported() {
        let mut failures = AcceptFailures::default();
        let start = Instant::now();
        let emfile = os_error(libc::EMFILE);
        assert_eq!(failures.failed(&emfile, start).1, Some(1));
        assert_eq!(failures.failed(&emfile, start + ms(1)).1, None);
        assert_eq!(failures.failed(&emfile, start + ms(2)).1, None);
        assert_eq!(failures.succeeded(start + ms(3)), None, "too soon: kept");
        assert_eq!(failures.succeeded(start + ms(10_000)), Some(2));
        assert_eq!(failures.succeeded(start + ms(30_000)), None, "nothing left");
        // Accepts that fail and succeed in turn log no more than a steady storm.
        let mut lines = 0;
        for i in 0..20_000u64 {
            let now = start + ms(30_000 + i);
            let report = if i % 2 == 0 {
                failures.failed(&emfile, now).1
            } else {
                failures.succeeded(now)
            };
            lines += u32::from(report.is_some());
        }
        assert_eq!(lines, 2, "one line per 10 s over 20 s");
    }
}
