//! Per-uid fairness: how many connections a uid may hold open, how many requests it may make a
//! second, and one heavy job (a /proc walk, a member listing) at a time. One user's flood then
//! costs that user alone. Root is exempt from the counts (it is also the one who can stop the
//! daemon) but not from the one-heavy-job rule, which only orders its own work.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The per-uid limits a daemon enforces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UidLimits {
    /// Connections a non-root uid may hold open at once.
    pub connections: usize,
    /// Request cost a non-root uid may spend a second (a request costs 1, a `list` or a
    /// `register` more); up to a second's worth may be spent at once.
    pub requests_per_second: u32,
}

impl Default for UidLimits {
    fn default() -> Self {
        Self {
            connections: 128,
            requests_per_second: 200,
        }
    }
}

/// How long a connection over its uid's rate is not read, at least.
const OVER_RATE_PAUSE: Duration = Duration::from_millis(500);
/// How often a uid's refusals are logged, at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Limits {
    limits: UidLimits,
    uids: Mutex<HashMap<u32, UidUse>>,
}

struct UidUse {
    connections: usize,
    /// Request budget left, refilled at `requests_per_second`.
    budget: f64,
    refilled: Instant,
    heavy: Arc<Semaphore>,
    refused_connections: Refusals,
    refused_requests: Refusals,
}

/// Refusals of one kind to one uid, logged at most every [`LOG_EVERY`]: one kind's lines never
/// hide the other's.
#[derive(Default)]
struct Refusals {
    /// Since the last line.
    count: u64,
    logged: Option<Instant>,
}

/// A connection held open; its uid's count goes down when it is dropped.
pub struct ConnectionSlot {
    limits: Arc<Limits>,
    uid: u32,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut uids = self.limits.uids();
        if let Some(usage) = uids.get_mut(&self.uid) {
            usage.connections = usage.connections.saturating_sub(1);
            // A uid with nothing open and a full budget has nothing worth remembering.
            if usage.connections == 0 && usage.refill(self.limits.limits) >= self.limits.burst() {
                uids.remove(&self.uid);
            }
        }
    }
}

impl Limits {
    pub fn new(limits: UidLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            uids: Mutex::new(HashMap::new()),
        })
    }

    fn uids(&self) -> MutexGuard<'_, HashMap<u32, UidUse>> {
        self.uids.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn burst(&self) -> f64 {
        f64::from(self.limits.requests_per_second)
    }

    fn usage<'a>(&self, uids: &'a mut HashMap<u32, UidUse>, uid: u32) -> &'a mut UidUse {
        uids.entry(uid).or_insert_with(|| UidUse {
            connections: 0,
            budget: self.burst(),
            refilled: Instant::now(),
            heavy: Arc::new(Semaphore::new(1)),
            refused_connections: Refusals::default(),
            refused_requests: Refusals::default(),
        })
    }

    /// Counts a new connection of `uid`, or says why it is refused.
    pub fn open_connection(self: &Arc<Self>, uid: u32) -> Result<ConnectionSlot, String> {
        let mut uids = self.uids();
        let usage = self.usage(&mut uids, uid);
        if uid != 0 && usage.connections >= self.limits.connections {
            usage.refused_connections.add("connections", uid);
            return Err(format!(
                "uid {uid} has {} connections open, the most allowed; close some first",
                usage.connections
            ));
        }
        usage.connections += 1;
        Ok(ConnectionSlot {
            limits: self.clone(),
            uid,
        })
    }

    /// Spends `cost` of `uid`'s request budget; when it is spent, says how long until it is
    /// back (the request is refused, and the connection reads nothing more meanwhile).
    pub fn spend(&self, uid: u32, cost: u32) -> Result<(), Duration> {
        if uid == 0 {
            return Ok(());
        }
        let mut uids = self.uids();
        let usage = self.usage(&mut uids, uid);
        let cost = f64::from(cost).min(self.burst());
        if usage.refill(self.limits) >= cost {
            usage.budget -= cost;
            return Ok(());
        }
        usage.refused_requests.add("requests", uid);
        // Until the request could be paid, and never less than OVER_RATE_PAUSE: a uid's
        // connections would otherwise all wake for each token earned, and all but one be
        // refused again.
        let missing = cost - usage.budget;
        let refilled =
            Duration::from_secs_f64(missing / f64::from(self.limits.requests_per_second.max(1)));
        Err(refilled.max(OVER_RATE_PAUSE))
    }

    /// Waits for `uid`'s turn at heavy work: one such job per uid at a time.
    pub async fn heavy(&self, uid: u32) -> OwnedSemaphorePermit {
        let semaphore = self.usage(&mut self.uids(), uid).heavy.clone();
        semaphore
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    pub fn limits(&self) -> UidLimits {
        self.limits
    }
}

impl UidUse {
    /// Tops the budget up for the time since the last refill; returns it.
    fn refill(&mut self, limits: UidLimits) -> f64 {
        let now = Instant::now();
        let rate = f64::from(limits.requests_per_second);
        let earned = now.duration_since(self.refilled).as_secs_f64() * rate;
        self.budget = (self.budget + earned).min(rate);
        self.refilled = now;
        self.budget
    }
}

impl Refusals {
    /// Counts a refusal; logs at most one line per uid and kind every [`LOG_EVERY`].
    fn add(&mut self, what: &'static str, uid: u32) {
        self.count += 1;
        let now = Instant::now();
        if self
            .logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
        {
            tracing::warn!(
                uid,
                limit = what,
                refused = self.count,
                "uid over its limit: refusing (logged at most every {LOG_EVERY:?})"
            );
            self.count = 0;
            self.logged = Some(now);
        }
    }
}
