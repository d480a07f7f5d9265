//! A kill's types: what it reports, how it fails, its phases and steps, what its searches
//! find; and the bounds its steps keep to, with when the kernel kill pays.

use std::time::{Duration, Instant};

use leash_common::{Member, Pid, TreeId};

use crate::{
    kernel::types::TreeStatus,
    proc::{self, ProcessRef},
};

/// How long SIGKILL rounds may go on before the kill is reported as failed (a process stuck in
/// uninterruptible sleep can hold out that long).
pub const KILL_ROUNDS_TIMEOUT: Duration = Duration::from_secs(30);
/// What a kill did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillReport {
    pub tree: TreeId,
    /// Members sent SIGTERM.
    pub terminated: usize,
    /// SIGKILLs sent, over all rounds.
    pub killed: usize,
    /// SIGKILL rounds.
    pub rounds: u32,
    /// From the start of the kill to an empty tree whose members have finished exiting.
    pub elapsed: Duration,
}

/// A member entry as a search found it, and what to send it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Queued {
    pub(super) pid: Pid,
    pub(super) member: Member,
    pub(super) signal: i32,
}

/// Why a kill could not finish.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KillError {
    /// Members were still in the map after [`KILL_ROUNDS_TIMEOUT`] of SIGKILL rounds (a process
    /// stuck in the kernel, in uninterruptible sleep, can hold out that long). The tree stays
    /// doomed: none of them can fork.
    #[error(
        "tree {tree} still has {remaining} members after {rounds} SIGKILL rounds in {:?}",
        KILL_ROUNDS_TIMEOUT
    )]
    Unkillable {
        tree: TreeId,
        remaining: u64,
        rounds: u32,
    },
    /// The maps could not be read or written.
    #[error("tree {tree}: {message}")]
    Kernel { tree: TreeId, message: String },
}

/// Where a search for the tree's members looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Search {
    /// The index's pids of the tree, if they can be shown to be every member; else the map.
    Index,
    /// The whole member map.
    Walk,
}

/// What a search found.
pub(super) struct Found {
    pub(super) members: Vec<(Pid, Member)>,
    /// Whether the whole map was walked for them.
    pub(super) walked: bool,
    /// The tree's `joined` counter, read before the search: whoever joins during it moves it.
    pub(super) joined: u64,
}

/// What a kill's enqueueing of a search's members did.
pub(super) struct Enqueued {
    pub(super) count: usize,
    pub(super) walked: bool,
    /// See [`Found::joined`].
    pub(super) joined: u64,
}

#[derive(Debug)]
pub(super) enum Phase {
    Start,
    Grace {
        until: Instant,
        /// The tree's `joined` counter when newcomers were last looked for.
        joined: u64,
    },
    Rounds {
        next_round: Instant,
        /// When a round that walks the map runs, even if no member joined.
        next_full_round: Instant,
        /// The tree's `joined` counter when the last round began.
        joined: u64,
        give_up: Instant,
    },
    /// The map is empty; these signalled members are still on their way out of the kernel.
    Exiting {
        pending: Vec<ProcessRef>,
        give_up: Instant,
    },
}

/// What the driver of a [`Kill`] does next.
#[derive(Debug)]
pub enum KillStep {
    /// Sleep this long, then step again.
    Wait(Duration),
    Done(KillReport),
}

/// Whether `found` members, looked up between the counters' reads `before` and `after`, are
/// every member: none joined or was put in between, so each one found was counted in `before`,
/// and it found as many as were counted.
pub(super) fn found_all(before: &TreeStatus, after: &TreeStatus, found: usize) -> bool {
    before.joined == after.joined
        && before.seeded == after.seeded
        && u64::try_from(found).is_ok_and(|found| found >= before.members)
}

/// The phase of SIGKILL rounds, begun `now`.
pub(super) fn rounds_from(now: Instant) -> Phase {
    Phase::Rounds {
        next_round: now,
        next_full_round: now,
        joined: 0,
        give_up: now + KILL_ROUNDS_TIMEOUT,
    }
}

/// How long a round waits for the signalled members to die before the next round.
pub(super) const ROUND_WAIT: Duration = Duration::from_millis(20);
/// After the first SIGKILL round, another is needed only when a member joined since the last
/// began (a SIGKILLed process dies; sending again changes nothing), but one that walks the
/// whole member map runs at least this often all the same.
pub(super) const FULL_ROUND_EVERY: Duration = Duration::from_secs(1);
/// The first of those walks comes sooner: it is the one that finds the entries of members the
/// kernel saw no exit of (see [`STALE_CHECKS_PER_WALK`]), the cause of a small tree's kill
/// lasting past its first round.
pub(super) const FIRST_WALK_AFTER: Duration = Duration::from_millis(100);
pub(super) const POLL: Duration = Duration::from_millis(1);
/// How many exited members one step takes off the list it waits on, so a step stays short at
/// any tree size.
pub(super) const EXIT_CHECKS_PER_STEP: usize = 1024;
/// How many members that were sent SIGKILL and are still in the map a walk checks for having
/// exited all the same (see `Kill::enqueue`): a check opens a pidfd, some microseconds.
pub(super) const STALE_CHECKS_PER_WALK: usize = 256;
/// How many queued members one step signals (or finds gone), so a step stays short at any tree
/// size. A signal costs a pidfd, a read of /proc/PID/stat and the signal, some 20-40 us (see
/// BENCHMARKS.md, 2b). Sent at normal priority,
/// the exits a SIGKILL sets off took the CPU from the sender, and with 2 cores a step of
/// SIGKILLs was measured at 15-60 ms; real-time (see `KillTarget::burst`), 1000 SIGKILLs went
/// out in about 20 ms.
pub const SIGNALS_PER_STEP: usize = 256;
/// How many of a kill's signals go out in bursts (see `KillTarget::burst`). A burst keeps the
/// sender's CPU from the exits it sets off: that lets a tree of a thousand die together, but
/// for a tree of 100k it left the exits one CPU for all of its signalling (7 s with 2 cores),
/// and the tree was gone after 14.4 s; past this count, the signals and the exits share the
/// CPUs, and the same tree was gone after 11.6 s.
pub(super) const BURST_SIGNALS: usize = 2048;

/// Whether one pass of the kernel kill over every task on the machine costs less than
/// signalling `members` through pidfds: about 0.7 µs a task against 20 µs a member here
/// (BENCHMARKS.md, 2b), so when the members are at least a thirtieth of the tasks. Beside a
/// tree of 50,000, a pass took 40 ms: a kill of 10 is faster member by member.
pub(super) fn kernel_kill_pays(members: usize) -> bool {
    members > 0
        && proc::tasks_on_the_machine().is_none_or(|tasks| {
            (members as u64).saturating_mul(KERNEL_KILL_TASKS_PER_MEMBER) >= tasks
        })
}

/// How many tasks a pass of the kernel kill walks in the time one member takes to signal
/// through a pidfd (see [`kernel_kill_pays`]).
const KERNEL_KILL_TASKS_PER_MEMBER: u64 = 30;
