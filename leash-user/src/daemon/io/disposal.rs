//! Closing what clients sent, where no close can hold up service. The last close of a file runs
//! its release in the closing thread, and some releases wait on the client: a TCP socket with
//! `SO_LINGER` and a send queue its peer never reads waits out the linger (years, if the client
//! says so); a FUSE file flushes to a server that need never answer; a Unix socket releases
//! the descriptors queued on it, and so does the daemon's end of a connection, whatever they
//! are. So nothing a client sent, and no connection socket that may hold some, is closed on a
//! serving thread: it is closed here, on a few threads of its own, and emptied first (see
//! `emptying`: sockets made abortive, what Unix sockets hold taken out and closed the same way).
//!
//! Each account's descriptors are closed in order by one thread at a time, so a close that blocks
//! holds up that account alone. What waits is bounded: [`PER_ACCOUNT`] descriptors per account and
//! [`OVERALL`] for all, on at most [`THREADS`] threads. A request whose descriptors find no
//! room is refused, with its connection, before they are read (they stay in the client's
//! message). A connection's own socket is closed in place when nothing queued on it carries
//! a descriptor. One that does waits in its account's lane, [`PARKED_PER_ACCOUNT`] at most
//! ([`PARKED_OVERALL`] for all accounts); past that it goes to the close queue (see
//! `close_queue`), where it costs the daemon no descriptor, and the account's new connections
//! are refused at accept until its lane moves again (see [`Disposal::parked_full`]).

use std::{
    collections::{HashMap, VecDeque},
    os::fd::{AsFd, OwnedFd},
    sync::{Arc, Mutex, MutexGuard},
};

use leash_common::Account;

use super::{accept::RateLimit, close_queue::CloseQueue, emptying::close_emptied};
use crate::sys;

/// Descriptors of one account that may wait to be closed (queued, or being closed).
pub(in crate::daemon) const PER_ACCOUNT: usize = 1024;
/// Descriptors of every account together.
pub(in crate::daemon) const OVERALL: usize = 4096;
/// Threads that close, at most; each serves one account at a time.
pub(in crate::daemon) const THREADS: usize = 8;
/// Connection sockets of one account that may wait in its lane: past these, its connections
/// are closed through the close queue, and refused at accept.
pub(in crate::daemon) const PARKED_PER_ACCOUNT: usize = 16;
/// Connection sockets of every account together that may wait in lanes: a user who connects as
/// many uids (a user namespace mapping subordinate uids, before it is identified) has no more.
const PARKED_OVERALL: usize = 256;

/// The daemon's disposal: cheap to clone, one for the whole daemon.
#[derive(Clone, Default)]
pub(in crate::daemon) struct Disposal(Arc<Mutex<State>>);

#[derive(Default)]
struct State {
    accounts: HashMap<Account, Lane>,
    /// Uids with descriptors queued and no thread serving them, in turn.
    waiting: VecDeque<Account>,
    threads: usize,
    /// Descriptors counted, every account's.
    counted: usize,
    /// Connection sockets in lanes, every account's.
    parked: usize,
    /// Started when first needed (None until then, or while it cannot be).
    close_queue: Option<CloseQueue>,
    /// Connections the close queue could not take, logged at most every 10 s.
    overflowed: RateLimit,
}

/// One account's descriptors waiting to be closed.
#[derive(Default)]
struct Lane {
    queue: VecDeque<Batch>,
    /// Descriptors queued, being closed, or reserved for a read.
    counted: usize,
    /// Whether a thread serves it (or it waits in `State::waiting` for one).
    served: bool,
    /// Connection sockets queued or being closed (counted in `counted` too).
    parked: usize,
}

struct Batch {
    fds: Vec<OwnedFd>,
    counted: usize,
    /// Dropped once the descriptors are closed: a connection's slot, held until its socket
    /// is really gone.
    then: Option<Box<dyn Send>>,
    /// Whether it is a connection's socket (counted in `Lane::parked`).
    parked: bool,
}

/// Room kept for descriptors about to be read, so that whatever the read brings has a place.
pub(in crate::daemon) struct Reservation {
    disposal: Disposal,
    account: Account,
    counted: usize,
}

impl Disposal {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for `count` descriptors of `account`, or None: too many of its own, or of everyone's,
    /// wait to be closed.
    pub(in crate::daemon) fn reserve(&self, account: Account, count: usize) -> Option<Reservation> {
        if count == 0 {
            // Nothing to keep room for (most reads): no lane is made for it.
            return Some(Reservation {
                disposal: self.clone(),
                account,
                counted: 0,
            });
        }
        let mut state = self.state();
        let lane_counted = state.accounts.get(&account).map_or(0, |lane| lane.counted);
        if lane_counted + count > PER_ACCOUNT || state.counted + count > OVERALL {
            return None;
        }
        state.count(account, count);
        Some(Reservation {
            disposal: self.clone(),
            account,
            counted: count,
        })
    }

    /// Closes the daemon's end of a connection of `account`, and drops `slot` once it is closed.
    /// Shut down first, it can be queued nothing more; if no descriptor is queued on it either,
    /// its close releases nothing of the client's and is done here. Otherwise it waits in its
    /// account's lane, over the lane's bounds if need be, or past [`PARKED_PER_ACCOUNT`] goes
    /// to the close queue (see [`carries_no_descriptors`] for what bounds those).
    pub(in crate::daemon) fn close_connection(
        &self,
        account: Account,
        socket: OwnedFd,
        slot: Option<Box<dyn Send>>,
    ) {
        let _ = sys::shutdown(socket.as_fd());
        if carries_no_descriptors(&socket) {
            drop(socket);
            drop(slot);
            return;
        }
        let socket = match self.overflow(account, socket) {
            Ok(()) => {
                // It costs the daemon nothing more: its account's slot is free.
                drop(slot);
                return;
            }
            Err(socket) => socket,
        };
        {
            let mut state = self.state();
            state.count(account, 1);
            state.parked += 1;
            state.accounts.entry(account).or_default().parked += 1;
        }
        let batch = Batch {
            fds: vec![socket],
            counted: 1,
            then: slot,
            parked: true,
        };
        self.queue(account, batch);
    }

    /// Sends `socket` to the close queue if `account` has [`PARKED_PER_ACCOUNT`] connection
    /// sockets in its lane already, or all accounts [`PARKED_OVERALL`]; Err gives it back for
    /// the lane (under those, or when the queue cannot take it).
    fn overflow(&self, account: Account, socket: OwnedFd) -> Result<(), OwnedFd> {
        let queue = {
            let mut state = self.state();
            let parked = state.accounts.get(&account).map_or(0, |lane| lane.parked);
            if parked < PARKED_PER_ACCOUNT && state.parked < PARKED_OVERALL {
                return Err(socket);
            }
            if state.close_queue.is_none() {
                state.close_queue = CloseQueue::start()
                    .inspect_err(|e| state.overflow_failed(account, &e.to_string()))
                    .ok();
            }
            match &state.close_queue {
                Some(queue) => queue.clone(),
                None => return Err(socket),
            }
        };
        queue.close(socket).inspect_err(|_| {
            self.state()
                .overflow_failed(account, "the close queue is full");
        })
    }

    /// Whether `account` has [`PARKED_PER_ACCOUNT`] connection sockets waiting in its lane:
    /// a close ahead of them has not returned, and its new connections are refused.
    pub(in crate::daemon) fn parked_full(&self, account: Account) -> bool {
        self.state()
            .accounts
            .get(&account)
            .is_some_and(|lane| lane.parked >= PARKED_PER_ACCOUNT)
    }

    /// Closes the daemon's listening socket, as it stops: the connections not accepted yet are
    /// closed with it, and what their clients queued on them. Charged to root (account 0).
    pub(in crate::daemon) fn close_listener(&self, listener: OwnedFd) {
        self.forced(0, 1).dispose(vec![listener]);
    }

    /// Room for `count` descriptors of `account`, over the bounds if need be.
    fn forced(&self, account: Account, count: usize) -> Reservation {
        self.count(account, count);
        Reservation {
            disposal: self.clone(),
            account,
            counted: count,
        }
    }

    fn count(&self, account: Account, count: usize) {
        self.state().count(account, count);
    }

    /// Queues `batch` for `account` and sees that a thread serves it.
    fn queue(&self, account: Account, batch: Batch) {
        let mut state = self.state();
        let lane = state.accounts.entry(account).or_default();
        lane.queue.push_back(batch);
        if lane.served {
            return;
        }
        lane.served = true;
        if state.threads >= THREADS {
            state.waiting.push_back(account);
            return;
        }
        state.threads += 1;
        drop(state);
        let disposal = self.clone();
        let started = std::thread::Builder::new()
            .name("leash-disposal".into())
            .spawn(move || disposal.serve(account));
        if let Err(e) = started {
            // Its descriptors wait (counted) for a thread that ends to take the account up.
            tracing::warn!(account, "cannot start a thread to close descriptors: {e}");
            let mut state = self.state();
            state.threads -= 1;
            state.waiting.push_back(account);
        }
    }

    /// A thread's work: closes `account`'s batches in order, then those of each account that waits,
    /// until none is left.
    fn serve(&self, mut account: Account) {
        loop {
            let next = {
                let mut state = self.state();
                match state
                    .accounts
                    .get_mut(&account)
                    .and_then(|lane| lane.queue.pop_front())
                {
                    Some(batch) => Some(batch),
                    None => {
                        state.forget_if_idle(account, true);
                        match state.waiting.pop_front() {
                            Some(waiting) => {
                                account = waiting;
                                None
                            }
                            None => {
                                state.threads -= 1;
                                return;
                            }
                        }
                    }
                }
            };
            if let Some(batch) = next {
                let (counted, parked) = (batch.counted, batch.parked);
                batch.close();
                let mut state = self.state();
                state.counted -= counted;
                state.parked -= usize::from(parked);
                if let Some(lane) = state.accounts.get_mut(&account) {
                    lane.counted -= counted;
                    lane.parked -= usize::from(parked);
                }
            }
        }
    }
}

/// Whether nothing queued on the Unix stream `socket`, shut down, carries a descriptor: it
/// is all peeked at, and no descriptor comes with it (none is put in the daemon's table to
/// find out: see [`sys::peek_carries_fds`]). (More than [`PEEK_BYTES`] queued, or a peek that
/// stops short, counts as carrying some.) Those that do carry some go to the disposal whatever
/// its bounds, [`PARKED_PER_ACCOUNT`] to an account's lane and the rest to the close queue.
/// Each holds at least one descriptor in flight of its client's, and the kernel bounds those
/// per user (by RLIMIT_NOFILE).
fn carries_no_descriptors(socket: &OwnedFd) -> bool {
    let queued = match sys::queued_bytes(socket.as_fd()) {
        Ok(0) => return true,
        Ok(queued) if queued <= PEEK_BYTES => queued,
        _ => return false,
    };
    let mut buf = vec![0; queued];
    let peeked = sys::peek_carries_fds(socket.as_fd(), &mut buf);
    peeked.is_ok_and(|(peeked, carries)| peeked == queued && !carries)
}

/// The most queued bytes looked through for descriptors before a connection is closed.
const PEEK_BYTES: usize = 64 * 1024;

impl State {
    /// The close queue could not take a connection of `account`, for `why`: it waits in its
    /// lane. Logged at most every 10 s, with the count since the last line.
    fn overflow_failed(&mut self, account: Account, why: &str) {
        if let Some(count) = self.overflowed.failed(std::time::Instant::now()) {
            tracing::warn!(
                account,
                count,
                "{why}: connections wait in their lane (logged at most every 10 s)"
            );
        }
    }

    fn count(&mut self, account: Account, count: usize) {
        self.counted += count;
        self.accounts.entry(account).or_default().counted += count;
    }

    /// Drops `account`'s lane if nothing of it is counted or queued; `unserve`: the thread that
    /// served it has left it.
    fn forget_if_idle(&mut self, account: Account, unserve: bool) {
        if let Some(lane) = self.accounts.get_mut(&account) {
            if unserve {
                lane.served = false;
            }
            if lane.counted == 0 && lane.queue.is_empty() && !lane.served {
                self.accounts.remove(&account);
            }
        }
    }
}

impl Batch {
    fn close(self) {
        self.fds.into_iter().for_each(close_emptied);
        drop(self.then);
    }
}

impl Reservation {
    /// Closes `fds` apart, in the room kept for them. (More than was kept are taken all the
    /// same: they are already the daemon's.)
    pub(in crate::daemon) fn dispose(self, fds: Vec<OwnedFd>) {
        self.dispose_then(fds, None);
    }

    fn dispose_then(mut self, fds: Vec<OwnedFd>, then: Option<Box<dyn Send>>) {
        if fds.is_empty() && then.is_none() {
            return;
        }
        let extra = fds.len().saturating_sub(self.counted);
        if extra > 0 {
            self.disposal.count(self.account, extra);
            self.counted += extra;
        }
        // The batch takes what it holds; the rest of the room is given back as self drops.
        let counted = fds.len();
        self.counted -= counted;
        self.disposal.queue(
            self.account,
            Batch {
                fds,
                counted,
                then,
                parked: false,
            },
        );
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.counted == 0 {
            return;
        }
        let mut state = self.disposal.state();
        state.counted -= self.counted;
        if let Some(lane) = state.accounts.get_mut(&self.account) {
            lane.counted -= self.counted;
        }
        state.forget_if_idle(self.account, false);
    }
}

#[cfg(test)]
mod tests;
