//! The tracker's one owner: a thread of its own, with its own runtime, so that no client's load
//! can hold up enforcement. It runs the event watch, the sweep and every kill, and between their
//! steps, one job at a time from the rest of the daemon. Urgent jobs (a lease's end, a kill)
//! go ahead of clients' jobs (registering, releasing), and every job is a bounded step: the
//! long parts of a request (walking /proc, listing members) are done elsewhere, reading the
//! maps through the daemon's [`TrackerView`](crate::kernel::TrackerView).
//!
//! The thread runs at a higher priority than the connections' threads: under a flood that
//! keeps every core busy, the kernel still gives enforcement its turn first.

use std::{
    cell::{Cell, RefCell, RefMut},
    io,
    rc::Rc,
    sync::Arc,
};

use tokio::{
    sync::{mpsc, oneshot},
    task::LocalSet,
};

use super::{Daemon, enforcement, recover};
use crate::{kernel::Tracker, sys};

/// Client jobs waiting for the owner before a client has to wait to queue one.
const QUEUED_JOBS: usize = 256;
/// The owner thread's nice value: ahead of the connections' threads (0).
const OWNER_NICE: i32 = -10;

/// What the owner thread holds; enforcement runs on it.
pub struct Owner {
    pub daemon: Arc<Daemon>,
    tracker: RefCell<Tracker>,
    /// The kernel's count of ring-buffer records it had no room for, when last read.
    pub events_dropped: Cell<u64>,
}

impl Owner {
    /// The tracker, for one step. Never held across an await: the owner's tasks take turns.
    pub fn tracker(&self) -> RefMut<'_, Tracker> {
        self.tracker.borrow_mut()
    }
}

type Job = Box<dyn FnOnce(&Rc<Owner>) + Send>;

/// How the rest of the daemon hands work to the owner.
pub struct Jobs {
    urgent: mpsc::UnboundedSender<Job>,
    requests: mpsc::Sender<Job>,
}

/// The owner's ends of the queues.
pub struct Queues {
    urgent: mpsc::UnboundedReceiver<Job>,
    requests: mpsc::Receiver<Job>,
}

pub fn queues() -> (Jobs, Queues) {
    let (urgent, urgent_rx) = mpsc::unbounded_channel();
    let (requests, requests_rx) = mpsc::channel(QUEUED_JOBS);
    (
        Jobs { urgent, requests },
        Queues {
            urgent: urgent_rx,
            requests: requests_rx,
        },
    )
}

impl Jobs {
    /// Runs `job` on the owner ahead of every client job, without waiting for it. Urgent jobs
    /// are never refused nor held up: they are enforcement's (their number is bounded by the
    /// connections and by the request rates).
    pub fn urgent(&self, job: impl FnOnce(&Rc<Owner>) + Send + 'static) {
        // The owner is gone only when the daemon is exiting.
        let _ = self.urgent.send(Box::new(job));
    }

    /// Runs `job` on the owner ahead of every client job, and returns its result; None if the
    /// owner has stopped.
    pub async fn urgent_with<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Rc<Owner>) -> R + Send + 'static,
    ) -> Option<R> {
        let (result, received) = oneshot::channel();
        self.urgent(move |owner| {
            let _ = result.send(job(owner));
        });
        received.await.ok()
    }

    /// Runs a client's `job` on the owner in its turn, and returns its result; None if the
    /// owner has stopped. `job` must be short: it holds up every kill while it runs.
    pub async fn request<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Rc<Owner>) -> R + Send + 'static,
    ) -> Option<R> {
        let (result, received) = oneshot::channel();
        let job: Job = Box::new(move |owner| {
            let _ = result.send(job(owner));
        });
        self.requests.send(job).await.ok()?;
        received.await.ok()
    }
}

/// Starts the owner thread with `tracker`. Taken over from pins, it first holds the previous
/// daemon's trees again.
pub fn start(
    daemon: Arc<Daemon>,
    tracker: Tracker,
    queues: Queues,
    taken_over: bool,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("leash-owner".to_owned())
        .spawn(move || {
            if let Err(e) = sys::set_thread_nice(OWNER_NICE) {
                tracing::warn!("cannot raise the enforcement thread's priority: {e}");
            }
            LocalSet::new().block_on(&runtime, serve(daemon, tracker, queues, taken_over));
        })?;
    Ok(())
}

async fn serve(daemon: Arc<Daemon>, tracker: Tracker, mut queues: Queues, taken_over: bool) {
    let events_dropped = tracker.stats().map_or(0, |stats| stats.events_dropped);
    let owner = Rc::new(Owner {
        daemon,
        tracker: RefCell::new(tracker),
        events_dropped: Cell::new(events_dropped),
    });
    if taken_over {
        recover::hold_again(&owner);
    }
    tokio::task::spawn_local(enforcement::watch_events(owner.clone()));
    tokio::task::spawn_local(enforcement::sweep(owner.clone()));
    loop {
        let job = tokio::select! {
            biased;
            Some(job) = queues.urgent.recv() => job,
            Some(job) = queues.requests.recv() => job,
            else => break,
        };
        job(&owner);
        // Kill steps, root exits and the sweep take their turn between any two jobs.
        tokio::task::yield_now().await;
    }
}
