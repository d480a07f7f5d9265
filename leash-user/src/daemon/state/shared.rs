//! What every task of the daemon shares: the maps to read, the owner's queue to hand changes
//! to, the registry of leases and trees, the subscribers, the limits and the counters.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use leash_client::protocol::Event;

use super::{
    commands::Jobs,
    registry::Registry,
    subscribers::{Audience, Subscribers},
};
use crate::{
    daemon::{
        io::{accept::RateLimit, admission::Admission, disposal::Disposal, stopping::Stopping},
        metrics::Metrics,
        rules::{config::Config, limits::Limits},
    },
    kernel::{Descent, Membership, Program, TrackerView, Whois},
};

/// Shared by every task of the daemon. The tracker itself is the owner thread's alone (see
/// `owner`); everyone else reads the maps through `view` and hands changes to `jobs`.
pub(in crate::daemon) struct Daemon {
    pub view: TrackerView,
    pub jobs: Jobs,
    pub registry: Registry,
    pub subscribers: Subscribers,
    pub limits: Arc<Limits>,
    /// Where the pins are, if pinned.
    pub pinned_at: Option<PathBuf>,
    /// The programs attached, for `status`.
    pub programs: Vec<&'static Program>,
    /// The membership guarantee in place, for `status` and the metrics.
    pub membership: Membership,
    /// Set when a connection ends or heavy work is done: the allocator's free memory is then
    /// given back.
    memory_freed: AtomicBool,
    /// Connections that could not be set up, for a log line at most every 10 s.
    pub setup_failures: Mutex<RateLimit>,
    /// What happened, counted for `--metrics`.
    pub metrics: Arc<Metrics>,
    /// Where what clients sent is closed, and their connections' sockets.
    pub disposal: Disposal,
    /// What the kernel knows of clients that /proc does not tell; asked one at a time.
    pub whois: Arc<Whois>,
    /// The descent iterator, for adoptions' passes (None: they walk /proc).
    pub descent: Option<Arc<Descent>>,
    /// Adoptions' passes at once, at most [`DESCENT_TURNS`]: each holds an entry of the
    /// iterators' requests (`DESCENTS`, 64), which the owner's kills and reconciling need too.
    pub descent_turn: tokio::sync::Semaphore,
    pub whois_turn: tokio::sync::Semaphore,
    /// Places for connections being set up, per uid and in all.
    pub admission: Admission,
    /// The daemon's own pid namespace (inode number).
    pub pid_namespace: u32,
    /// The word to every connection that the daemon is stopping.
    pub stopping: Stopping,
    pub config: Config,
}

/// How many adoptions' passes may run at once (see [`Daemon::descent_turn`]): each walks every
/// task on a blocking thread, and more at once would only share the same two cores.
pub(in crate::daemon) const DESCENT_TURNS: usize = 4;

impl Daemon {
    /// A daemon serving `config`, reading the maps through `view`, handing changes to `jobs`.
    pub(in crate::daemon) fn new(
        config: Config,
        view: TrackerView,
        jobs: Jobs,
        pinned_at: Option<PathBuf>,
        (programs, membership): (Vec<&'static Program>, Membership),
        (whois, descent): (Arc<Whois>, Option<Arc<Descent>>),
        pid_namespace: u32,
    ) -> Self {
        Self {
            view,
            jobs,
            registry: Registry::default(),
            subscribers: Subscribers::default(),
            limits: Limits::new(config.uid_limits),
            pinned_at,
            programs,
            membership,
            memory_freed: AtomicBool::new(false),
            setup_failures: Mutex::default(),
            metrics: Arc::default(),
            disposal: Disposal::default(),
            whois,
            descent,
            descent_turn: tokio::sync::Semaphore::new(DESCENT_TURNS),
            whois_turn: tokio::sync::Semaphore::new(1),
            admission: Admission::new(config.uid_limits.connections),
            pid_namespace,
            stopping: Stopping::default(),
            config,
        }
    }

    /// Sends an event of a tree to the subscribers of its `audience`.
    pub(in crate::daemon) fn emit(&self, audience: &Audience, event: Event) {
        self.subscribers.deliver(audience, event, None);
    }

    /// Sends an event about a tree's root, whose numbers in each pid namespace are
    /// `root_numbers`: subscribers in containers are told its number there even once it is gone.
    pub(in crate::daemon) fn emit_about_root(
        &self,
        audience: &Audience,
        event: Event,
        root_numbers: &[u32],
    ) {
        self.subscribers
            .deliver(audience, event, Some(root_numbers));
    }

    /// Notes that memory was freed (a connection ended, heavy work is done): the allocator's
    /// free memory is given back soon.
    pub(in crate::daemon) fn memory_freed(&self) {
        self.memory_freed.store(true, Ordering::Relaxed);
    }

    /// Whether memory was freed since the last call.
    pub(in crate::daemon) fn take_memory_freed(&self) -> bool {
        self.memory_freed.swap(false, Ordering::Relaxed)
    }
}
