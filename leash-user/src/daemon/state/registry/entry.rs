//! A registered tree as the registry files it, and what the registry's methods answer.

use std::{sync::Arc, time::Duration};

use leash_client::protocol::{KillSummary, LeaseId, RootExitPolicy, TreeId, TreeState};
use leash_common::{Account, Holder};
use tokio::sync::watch;

use crate::{
    daemon::{rules::auth::TreeFacts, state::subscribers::Audience},
    kernel::KillError,
};

/// The outcome of a kill, as every waiter sees it.
pub(crate) type KillOutcome = Result<KillSummary, KillError>;

/// Where a kill's outcome comes, once it is known.
pub(crate) type PendingOutcome = watch::Receiver<Option<KillOutcome>>;

/// A kill under way.
#[derive(Debug)]
pub(super) struct PendingKill {
    pub(super) outcome: PendingOutcome,
    /// The grace period, which a later kill, the lease's end or shutdown may shorten (never
    /// lengthen); the kill task follows it.
    pub(super) grace: watch::Sender<Duration>,
}

/// What the daemon knows about a registered tree, beyond the kernel maps.
#[derive(Debug)]
pub(crate) struct TreeEntry {
    pub lease: LeaseId,
    pub owner_uid: u32,
    /// The pid of the lease's host (0 if no daemon recorded one): named in the tree's log lines,
    /// which may come after the lease has ended.
    pub host_pid: u32,
    /// The lease's account, and the account of the client that asked for it (the same, or
    /// another's that used the lease's token): both count it against their limits.
    pub account: Account,
    pub registrar_account: Account,
    /// The pid namespaces of the lease's host, its own first: clients in these see the tree.
    pub registered_from: Arc<[u32]>,
    /// The root's number in each pid namespace it is in, the daemon's first (`NSpid`): how
    /// clients in containers are told it, even once it has exited.
    pub root: Box<[u32]>,
    pub on_root_exit: RootExitPolicy,
    pub grace: Duration,
    pub root_exited: bool,
    /// Set once a kill has started: every later kill request waits on the same one.
    pub(super) kill: Option<PendingKill>,
    /// The last kill gave up on members stuck in the kernel (the tree stays doomed).
    pub(super) unkillable: bool,
}

impl TreeEntry {
    /// A tree just registered (or found again in the pins): no kill under way.
    pub(crate) fn new(
        lease: LeaseId,
        holder: &Holder,
        registrar_account: Account,
        registered_from: Arc<[u32]>,
        root: Box<[u32]>,
        on_root_exit: RootExitPolicy,
        grace: Duration,
    ) -> Self {
        Self {
            lease,
            owner_uid: holder.owner_uid,
            host_pid: holder.host_pid,
            account: holder.account,
            registrar_account,
            registered_from,
            root,
            on_root_exit,
            grace,
            root_exited: false,
            kill: None,
            unkillable: false,
        }
    }

    /// Who holds it.
    pub(crate) fn ownership(&self) -> Ownership {
        Ownership {
            lease: self.lease,
            owner_uid: self.owner_uid,
            registered_from: self.registered_from.clone(),
        }
    }

    /// Who may hear of the tree's events.
    pub(crate) fn audience(&self) -> Audience {
        Audience {
            owner_uid: self.owner_uid,
            registered_from: self.registered_from.clone(),
        }
    }

    pub(crate) fn state(&self) -> TreeState {
        match (&self.kill, self.unkillable) {
            (Some(_), _) => TreeState::Killing,
            (None, true) => TreeState::Unkillable,
            (None, false) => TreeState::Live,
        }
    }

    /// Whom it counts against.
    pub(super) fn charged_to(&self, account: Account) -> bool {
        self.account == account || self.registrar_account == account
    }
}

/// What a tree's kill is to do, as [`Registry::begin_kill`] found it.
pub(crate) enum KillStart {
    /// No kill was under way: the caller runs this one.
    Begun(BegunKill),
    /// One is: its outcome, its grace shortened if the new one is shorter.
    UnderWay(PendingOutcome),
}

/// A kill begun, for the task that runs it.
pub(crate) struct BegunKill {
    pub audience: Audience,
    pub lease: LeaseId,
    pub host_pid: u32,
    pub owner_uid: u32,
    pub grace: Duration,
    /// Where the outcome goes, and where its waiters read it.
    pub done: watch::Sender<Option<KillOutcome>>,
    pub outcome: PendingOutcome,
    /// The grace period as later kills shorten it.
    pub grace_asked: watch::Receiver<Duration>,
}

/// A root's exit, recorded: what its tree's policy and events need.
pub(crate) struct RootExit {
    pub audience: Audience,
    pub lease: LeaseId,
    pub root: Box<[u32]>,
    pub policy: RootExitPolicy,
}

/// Who holds a tree: what the rules of `auth` weigh.
pub(crate) struct Ownership {
    pub lease: LeaseId,
    pub owner_uid: u32,
    pub registered_from: Arc<[u32]>,
}

impl Ownership {
    /// The facts the rules weigh, for the tree whose chain (it, then each tree it is nested
    /// in) is `chain`.
    pub(crate) fn facts<'a>(&'a self, chain: &'a [TreeId]) -> TreeFacts<'a> {
        TreeFacts {
            lease: self.lease,
            owner_uid: self.owner_uid,
            chain,
            registered_from: &self.registered_from,
        }
    }
}

/// The lease a new tree goes under, with who holds it and where its host runs.
pub(crate) struct LeaseHolder {
    pub lease: LeaseId,
    pub holder: Holder,
    /// The host's pid namespaces, its own first: the tree is registered from there.
    pub pid_namespaces: Arc<[u32]>,
}

/// Why a lease could not be found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoLease {
    /// The connection's own lease is gone (it is ending).
    Own,
    /// No live lease has the token.
    Token,
}

/// Why a registration may not go on: `account` holds `held` trees (some maybe being
/// registered), the most it may.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OverQuota {
    pub account: Account,
    pub held: usize,
}
