//! Per-account fairness: how many connections an account may hold open, how many requests it
//! may make a second, and one heavy job (a /proc walk, a member listing) at a time. One user's
//! flood then costs that user alone, whatever uids they hold (an account is a user with every
//! subordinate uid of theirs: see `identity`). Root is exempt from the counts (it is also the
//! one who can stop the daemon) but not from the one-heavy-job rule, which only orders its own
//! work.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use leash_common::Account;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How an account is named in messages and logs.
pub(in crate::daemon) fn describe(account: Account) -> String {
    match u32::try_from(account) {
        Ok(uid) => format!("uid {uid}"),
        Err(_) => format!("user namespace {}", account & 0xffff_ffff),
    }
}

/// The per-account limits a daemon enforces (named per uid, as most accounts are one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UidLimits {
    /// Connections an account other than root may hold open at once.
    pub connections: usize,
    /// Request cost an account other than root may spend a second (a request costs 1, a `list` or a
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

/// How long a connection over its account's rate is not read, at least.
const OVER_RATE_PAUSE: Duration = Duration::from_millis(500);
/// How often an account's refusals are logged, at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub(in crate::daemon) struct Limits {
    limits: UidLimits,
    accounts: Mutex<HashMap<Account, UidUse>>,
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

/// Refusals of one kind to one account, logged at most every [`LOG_EVERY`]: one kind's lines never
/// hide the other's.
#[derive(Default)]
struct Refusals {
    /// Since the last line.
    count: u64,
    logged: Option<Instant>,
}

/// A connection held open; its account's count goes down when it is dropped.
pub(in crate::daemon) struct ConnectionSlot {
    limits: Arc<Limits>,
    account: Account,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut accounts = self.limits.accounts();
        if let Some(usage) = accounts.get_mut(&self.account) {
            usage.connections = usage.connections.saturating_sub(1);
            // An account with nothing open and a full budget has nothing worth remembering.
            if usage.connections == 0 && usage.refill(self.limits.limits) >= self.limits.burst() {
                accounts.remove(&self.account);
            }
        }
    }
}

impl Limits {
    pub(in crate::daemon) fn new(limits: UidLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            accounts: Mutex::new(HashMap::new()),
        })
    }

    fn accounts(&self) -> MutexGuard<'_, HashMap<Account, UidUse>> {
        self.accounts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn burst(&self) -> f64 {
        f64::from(self.limits.requests_per_second)
    }

    fn usage<'a>(
        &self,
        accounts: &'a mut HashMap<Account, UidUse>,
        account: Account,
    ) -> &'a mut UidUse {
        accounts.entry(account).or_insert_with(|| UidUse {
            connections: 0,
            budget: self.burst(),
            refilled: Instant::now(),
            heavy: Arc::new(Semaphore::new(1)),
            refused_connections: Refusals::default(),
            refused_requests: Refusals::default(),
        })
    }

    /// Counts a new connection of `account`, or says why it is refused.
    pub(in crate::daemon) fn open_connection(
        self: &Arc<Self>,
        account: Account,
    ) -> Result<ConnectionSlot, String> {
        let mut accounts = self.accounts();
        let usage = self.usage(&mut accounts, account);
        if account != 0 && usage.connections >= self.limits.connections {
            usage.refused_connections.add("connections", account);
            return Err(format!(
                "{} has {} connections open, the most allowed; close some first",
                describe(account),
                usage.connections
            ));
        }
        usage.connections += 1;
        Ok(ConnectionSlot {
            limits: self.clone(),
            account,
        })
    }

    /// Spends `cost` of `account`'s request budget; when it is spent, says how long until it
    /// is back (the request is refused, and the connection reads nothing more meanwhile).
    pub(in crate::daemon) fn spend(&self, account: Account, cost: u32) -> Result<(), Duration> {
        if account == 0 {
            return Ok(());
        }
        let mut accounts = self.accounts();
        let usage = self.usage(&mut accounts, account);
        let cost = f64::from(cost).min(self.burst());
        if usage.refill(self.limits) >= cost {
            usage.budget -= cost;
            return Ok(());
        }
        usage.refused_requests.add("requests", account);
        // Until the request could be paid, and never less than OVER_RATE_PAUSE: an account's
        // connections would otherwise all wake for each token earned, and all but one be
        // refused again.
        let missing = cost - usage.budget;
        let refilled =
            Duration::from_secs_f64(missing / f64::from(self.limits.requests_per_second.max(1)));
        Err(refilled.max(OVER_RATE_PAUSE))
    }

    /// Waits for `account`'s turn at heavy work: one such job per account at a time.
    pub(in crate::daemon) async fn heavy(&self, account: Account) -> OwnedSemaphorePermit {
        let semaphore = self.usage(&mut self.accounts(), account).heavy.clone();
        semaphore
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    pub(in crate::daemon) fn limits(&self) -> UidLimits {
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
    /// Counts a refusal; logs at most one line per account and kind every [`LOG_EVERY`].
    fn add(&mut self, what: &'static str, account: Account) {
        self.count += 1;
        let now = Instant::now();
        if self
            .logged
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY)
        {
            tracing::warn!(
                account = describe(account),
                limit = what,
                refused = self.count,
                "over its limit: refusing (logged at most every {LOG_EVERY:?})"
            );
            self.count = 0;
            self.logged = Some(now);
        }
    }
}
