//! Where one connection's replies and events wait for its writer. Both queues are bounded in
//! bytes, not lines: a client that leaves its replies unread is disconnected, a subscriber that
//! falls behind loses events (counted, and told how many exactly where they were lost), and the
//! daemon never waits for either.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
};

use leash_client::protocol::{Event, EventKind, ServerLine};
use tokio::{
    io::{AsyncWrite, AsyncWriteExt},
    sync::Notify,
};

use crate::daemon::{metrics::Metrics, rules::pid_numbering::PidNumbering};

/// Reply bytes queued before the connection reads no further request until some are written
/// (a client that pipelines requests and reads its replies is slowed to its own pace).
pub(in crate::daemon) const REPLY_BYTES: usize = 128 * 1024;
/// Reply bytes past which the client is disconnected: only replies that come on their own (a
/// kill's) can take the queue past [`REPLY_BYTES`], and they are few and small.
pub(in crate::daemon) const MAX_REPLY_BYTES: usize = 4 * REPLY_BYTES;
/// Event bytes queued for a subscriber before further events are dropped (and counted).
pub(in crate::daemon) const EVENT_BYTES: usize = 128 * 1024;

/// One connection's queues. Clones share them.
#[derive(Clone, Default)]
pub(in crate::daemon) struct Outbox(Arc<Shared>);

#[derive(Default)]
struct Shared {
    queues: Mutex<Queues>,
    /// Wakes the writer when something is queued or the outbox closes.
    wake: Notify,
    /// Wakes the reader when replies were written.
    written: Notify,
    /// Where error replies and dropped events are counted, if anywhere.
    metrics: Option<Arc<Metrics>>,
}

#[derive(Default)]
struct Queues {
    replies: VecDeque<Vec<u8>>,
    reply_bytes: usize,
    events: VecDeque<Queued>,
    event_bytes: usize,
    /// The connection is ending, or a reply did not fit: nothing more is queued, and the
    /// writer stops once what is queued is out (at once, if it overflowed).
    closed: bool,
    overflowed: bool,
    /// The line written after everything else, once the outbox is closed (`closing`): it
    /// counts against no bound, so that a full queue of events does not lose it.
    last: Option<Vec<u8>>,
}

/// An event line, shared by every subscriber it goes to (encoded once), or a count of those
/// lost at this point of the stream.
enum Queued {
    Line(Arc<[u8]>),
    /// An event for a subscriber in a container, numbered (which reads /proc) and encoded by
    /// its own writer: never by the daemon's thread that delivers it. `bytes` is what it counts
    /// for in the queue (its line as the daemon numbers it).
    ToNumber {
        event: Box<Event>,
        numbering: PidNumbering,
        bytes: usize,
    },
    Dropped(u64),
}

impl Outbox {
    /// An outbox whose error replies and dropped events count in `metrics`.
    pub(in crate::daemon) fn counted(metrics: Arc<Metrics>) -> Self {
        Self(Arc::new(Shared {
            metrics: Some(metrics),
            ..Shared::default()
        }))
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        self.0.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a reply. One that does not fit under [`MAX_REPLY_BYTES`] closes the outbox: the
    /// client is not reading, and is disconnected.
    pub(in crate::daemon) fn reply(&self, line: &ServerLine) {
        if let (Some(metrics), Some(error)) = (&self.0.metrics, line.error_body()) {
            metrics.refused(error.code);
        }
        let bytes = encode(line);
        let mut queues = self.queues();
        if queues.closed {
            return;
        }
        if !queues.replies.is_empty() && queues.reply_bytes + bytes.len() > MAX_REPLY_BYTES {
            queues.closed = true;
            queues.overflowed = true;
        } else {
            queues.reply_bytes += bytes.len();
            queues.replies.push_back(bytes);
        }
        drop(queues);
        self.0.wake.notify_one();
    }

    /// Queues an event line; one that does not fit is dropped and counted where it was lost.
    /// Returns false once the outbox is closed (the subscriber is gone).
    pub(in crate::daemon) fn event(&self, line: &Arc<[u8]>) -> bool {
        self.queue_event(line.len(), || Queued::Line(line.clone()))
    }

    /// Queues `event` to be sent with its pids as `numbering` gives them, counting `bytes` for it;
    /// as [`Outbox::event`] otherwise.
    pub(in crate::daemon) fn event_to_number(
        &self,
        event: &Event,
        numbering: PidNumbering,
        bytes: usize,
    ) -> bool {
        self.queue_event(bytes, || Queued::ToNumber {
            event: Box::new(event.clone()),
            numbering,
            bytes,
        })
    }

    fn queue_event(&self, bytes: usize, queued: impl FnOnce() -> Queued) -> bool {
        let mut queues = self.queues();
        if queues.closed {
            return false;
        }
        if queues.event_bytes + bytes <= EVENT_BYTES {
            queues.event_bytes += bytes;
            queues.events.push_back(queued());
        } else {
            queues.count_dropped(1);
            if let Some(metrics) = &self.0.metrics {
                metrics.event_dropped();
            }
        }
        drop(queues);
        self.0.wake.notify_one();
        true
    }

    /// Counts `count` events lost before they reached this subscriber (in the kernel's ring
    /// buffer, say). Returns false once the outbox is closed.
    pub(in crate::daemon) fn dropped(&self, count: u64) -> bool {
        let mut queues = self.queues();
        if queues.closed {
            return false;
        }
        queues.count_dropped(count);
        drop(queues);
        self.0.wake.notify_one();
        true
    }

    /// Waits until fewer than [`REPLY_BYTES`] of replies are queued; false if that did not
    /// happen within `patience` (the client is not reading) or the outbox closed.
    pub(in crate::daemon) async fn room_for_replies(&self, patience: std::time::Duration) -> bool {
        let room = async {
            loop {
                // Registered before the queue is looked at, so a write in between is not lost.
                let written = self.0.written.notified();
                {
                    let queues = self.queues();
                    if queues.closed {
                        return false;
                    }
                    if queues.reply_bytes < REPLY_BYTES {
                        return true;
                    }
                }
                written.await;
            }
        };
        tokio::time::timeout(patience, room).await.unwrap_or(false)
    }

    /// Whether a reply did not fit.
    pub(in crate::daemon) fn overflowed(&self) -> bool {
        self.queues().overflowed
    }

    /// Ends the outbox: nothing more is queued; the writer sends what is queued, then stops.
    pub(in crate::daemon) fn close(&self) {
        self.queues().closed = true;
        self.0.wake.notify_one();
        self.0.written.notify_waiters();
    }

    /// Ends the outbox with `line`, written after all that is queued (unless the client
    /// overflowed its replies: then nothing more is written).
    pub(in crate::daemon) fn close_with(&self, line: &ServerLine) {
        let bytes = encode(line);
        {
            let mut queues = self.queues();
            if !queues.closed {
                queues.last = Some(bytes);
            }
        }
        self.close();
    }

    /// Whether nothing is queued and nobody but this handle and the writer's can queue more
    /// (no reply is still to come).
    pub(in crate::daemon) fn is_settled(&self) -> bool {
        self.queues().replies.is_empty() && Arc::strong_count(&self.0) <= 2
    }

    pub(in crate::daemon) fn is_closed(&self) -> bool {
        self.queues().closed
    }

    /// The next line to write: replies first, then events in order; None when the writer is
    /// done.
    async fn next(&self) -> Option<Vec<u8>> {
        loop {
            // Registered before the queues are looked at, so a wake in between is not lost.
            let woken = self.0.wake.notified();
            {
                let mut queues = self.queues();
                if queues.overflowed {
                    return None;
                }
                if let Some(reply) = queues.replies.pop_front() {
                    queues.reply_bytes -= reply.len();
                    drop(queues);
                    self.0.written.notify_waiters();
                    return Some(reply);
                }
                match queues.events.pop_front() {
                    Some(Queued::Line(line)) => {
                        queues.event_bytes -= line.len();
                        return Some(line.to_vec());
                    }
                    Some(Queued::ToNumber {
                        event,
                        numbering,
                        bytes,
                    }) => {
                        queues.event_bytes -= bytes;
                        drop(queues);
                        return Some(encode(&ServerLine::event(numbering.number_event(&event))));
                    }
                    Some(Queued::Dropped(count)) => {
                        let mut dropped = Event::new(EventKind::Dropped, 0, 0, None);
                        dropped.count = Some(count);
                        return Some(encode(&ServerLine::event(dropped)));
                    }
                    None if queues.closed => return queues.last.take(),
                    None => {}
                }
            }
            woken.await;
        }
    }

    /// Writes queued lines to `writer` until the outbox is closed and drained, or the client
    /// goes away.
    pub(in crate::daemon) async fn write_to(self, mut writer: impl AsyncWrite + Unpin) {
        while let Some(line) = self.next().await {
            if writer.write_all(&line).await.is_err() {
                break;
            }
        }
        self.close();
    }
}

impl Queues {
    /// A count sits where the events were lost: after the last one queued, merged with a count
    /// already there. It takes no room: at most one follows each queued line.
    fn count_dropped(&mut self, count: u64) {
        match self.events.back_mut() {
            Some(Queued::Dropped(n)) => *n += count,
            _ => self.events.push_back(Queued::Dropped(count)),
        }
    }
}

#[cfg(test)]
impl Outbox {
    /// Closes the outbox and returns all it writes.
    pub(in crate::daemon) fn written(&self) -> Vec<u8> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        self.close();
        let mut written = Vec::new();
        rt.block_on(self.clone().write_to(&mut written));
        written
    }
}

/// One line of the protocol, newline included.
pub(in crate::daemon) fn encode(line: &ServerLine) -> Vec<u8> {
    // A ServerLine is plain data: encoding it cannot fail.
    let mut bytes = serde_json::to_vec(line).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use leash_client::protocol::{ErrorCode, Reply};

    fn drain(outbox: &Outbox) -> Vec<String> {
        String::from_utf8(outbox.written())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn lost_events_are_counted_where_they_were_lost() {
        let outbox = Outbox::default();
        // Two of these do not fit.
        let mut line = vec![b'x'; EVENT_BYTES / 2];
        line.push(b'\n');
        let line: Arc<[u8]> = line.into();
        assert!(outbox.event(&line));
        for _ in 0..5 {
            assert!(outbox.event(&line));
        }
        assert!(outbox.dropped(10));
        let lines = drain(&outbox);
        assert_eq!(lines.len(), 2);
        assert!(lines[1].contains("\"count\":15"), "{}", lines[1]);
    }

    #[test]
    fn a_counted_outbox_counts_error_replies_and_the_events_it_drops() {
        let metrics = Arc::new(Metrics::default());
        let outbox = Outbox::counted(metrics.clone());
        outbox.reply(&ServerLine::error(Some(1), ErrorCode::NotFound, "no"));
        outbox.reply(&ServerLine::ok(2, Reply::Subscribed));
        outbox.reply(&ServerLine::error(None, ErrorCode::TooLong, "long"));
        let mut line = vec![b'x'; EVENT_BYTES / 2];
        line.push(b'\n');
        let line: Arc<[u8]> = line.into();
        for _ in 0..4 {
            assert!(outbox.event(&line));
        }
        // Lost before the daemon read them: the kernel's count, not the subscriber's.
        assert!(outbox.dropped(10));
        let counted = metrics.counted();
        let refused: u64 = counted.refused.iter().sum();
        assert_eq!(refused, 2);
        assert_eq!(counted.events_dropped, 3);
        // An outbox made without metrics counts nowhere (and is none the worse).
        Outbox::default().reply(&ServerLine::error(Some(1), ErrorCode::NotFound, "no"));
        assert_eq!(metrics.counted(), counted);
    }

    #[test]
    fn the_last_line_comes_after_everything_queued_even_past_the_bounds() {
        let outbox = Outbox::default();
        outbox.reply(&ServerLine::ok(1, Reply::Subscribed));
        let mut line = vec![b'x'; EVENT_BYTES - 1];
        line.push(b'\n');
        let line: Arc<[u8]> = line.into();
        assert!(outbox.event(&line));
        assert!(outbox.event(&line), "queued as a count of one dropped");
        let closing = Event::closing(7, leash_client::protocol::ClosingReason::Shutdown);
        outbox.close_with(&ServerLine::event(closing));
        assert!(!outbox.event(&line), "closed");
        let lines = drain(&outbox);
        assert_eq!(lines.len(), 4, "reply, event, count, closing");
        assert_eq!(
            lines[3],
            r#"{"event":{"kind":"closing","tree":0,"lease":7,"reason":"shutdown"}}"#
        );
        // Once closed, a second last line is not taken.
        let outbox = Outbox::default();
        outbox.close();
        outbox.close_with(&ServerLine::event(Event::new(
            EventKind::Closing,
            0,
            1,
            None,
        )));
        assert!(drain(&outbox).is_empty());
    }

    #[test]
    fn a_client_that_leaves_replies_unread_overflows() {
        let outbox = Outbox::default();
        let reply = ServerLine::error(Some(1), ErrorCode::BadRequest, "x".repeat(MAX_REPLY_BYTES));
        outbox.reply(&reply);
        assert!(!outbox.overflowed(), "one reply always fits an empty queue");
        outbox.reply(&ServerLine::ok(2, Reply::Subscribed));
        assert!(outbox.overflowed());
        assert!(!outbox.event(&Arc::from(&b"e\n"[..])), "closed");
        assert!(
            drain(&outbox).is_empty(),
            "an overflowed outbox writes nothing more"
        );
    }
}
