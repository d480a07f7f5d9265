//! The daemon's word to its connections that it is stopping, and its wait for them to take it:
//! each connection then sends its client a `closing` event, its last line, so that a host can
//! tell a shutdown (its trees killed) from a hand-over (its trees kept by the next daemon) and
//! from a connection lost.

use std::time::Duration;

use leash_client::protocol::ClosingReason;
use tokio::sync::watch;

/// Whether, and why, the daemon is stopping. Each connection served listens.
pub(in crate::daemon) struct Stopping(watch::Sender<Option<ClosingReason>>);

impl Default for Stopping {
    fn default() -> Self {
        Self(watch::Sender::new(None))
    }
}

impl Stopping {
    /// An ear for one connection: the daemon's stop waits until it is dropped (or its patience
    /// runs out), so a connection holds it until its last line is written.
    pub(in crate::daemon) fn listen(&self) -> Listener {
        Listener(self.0.subscribe())
    }

    /// Tells every connection the daemon is stopping for `reason`, and waits until each has
    /// closed, `patience` at most: a client that does not read is not waited for. Returns how
    /// many were still open then.
    pub(in crate::daemon) async fn close_connections(
        &self,
        reason: ClosingReason,
        patience: Duration,
    ) -> usize {
        self.0.send_replace(Some(reason));
        let _ = tokio::time::timeout(patience, self.0.closed()).await;
        self.0.receiver_count()
    }
}

/// One connection's ear (see [`Stopping::listen`]).
pub(in crate::daemon) struct Listener(watch::Receiver<Option<ClosingReason>>);

impl Listener {
    /// Resolves once the daemon is stopping (at once if it already is), with why.
    pub(in crate::daemon) async fn stopping(&mut self) -> ClosingReason {
        if let Ok(reason) = self.0.wait_for(Option::is_some).await
            && let Some(reason) = *reason
        {
            return reason;
        }
        // The daemon dropped its side without a word: it is not stopping through here.
        std::future::pending().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_listener_hears_the_reason_and_the_stop_waits_for_them() {
        let stopping = Stopping::default();
        let mut early = stopping.listen();
        let listened = tokio::spawn(async move {
            let reason = early.stopping().await;
            drop(early);
            reason
        });
        let left = stopping
            .close_connections(ClosingReason::HandOver, Duration::from_secs(10))
            .await;
        assert_eq!(left, 0);
        assert_eq!(listened.await.unwrap(), ClosingReason::HandOver);
        // One that listens after the word hears it at once.
        assert_eq!(stopping.listen().stopping().await, ClosingReason::HandOver);
    }

    #[tokio::test]
    async fn a_listener_that_never_closes_is_not_waited_for_past_the_patience() {
        let stopping = Stopping::default();
        let _deaf = stopping.listen();
        let left = stopping
            .close_connections(ClosingReason::Shutdown, Duration::from_millis(10))
            .await;
        assert_eq!(left, 1);
    }
}
