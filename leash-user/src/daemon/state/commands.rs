//! What the rest of the daemon asks of the owner thread, the one place that lists what runs
//! on the enforcing thread. Urgent commands (enforcement's: a lease's end, a kill, a root's
//! exit) go ahead of clients' commands (registering, releasing); every command is a bounded
//! step: the long parts of a request (walking /proc, listing members) are done elsewhere,
//! reading the maps through the daemon's [`TrackerView`](crate::kernel::TrackerView).

use std::{os::fd::OwnedFd, sync::Arc, time::Duration};

use leash_client::protocol::{ErrorCode, KillReason, LeaseId, RootExitPolicy, TreeId};
use leash_common::Holder;
use tokio::sync::{mpsc, oneshot};

use super::registry::{PendingOutcome, Reservation, TreeEntry};
use crate::{
    daemon::rules::{lease_end::LeaseEnd, refusal::Refusal},
    kernel::{self, Adoption, SeedStep, descent::Reading},
    proc::{ProcessInfo, ProcessRef},
};

/// Client commands waiting for the owner before a client has to wait to queue one.
const QUEUED_COMMANDS: usize = 256;

/// A command to the owner thread.
pub(in crate::daemon) enum Command {
    // Urgent: enforcement's.
    /// A lease ended, for `reason`: kill its trees.
    EndLease { lease: LeaseId, reason: LeaseEnd },
    /// Watch the host of `lease` (its pidfd): end the lease when it exits, or stop watching
    /// when `until` closes (the connection that holds the lease ended it itself).
    WatchHost {
        lease: LeaseId,
        host: OwnedFd,
        until: oneshot::Receiver<()>,
    },
    /// Kill `tree` (or shorten a kill under way to `grace`); the outcome to wait on, None if
    /// there is no such tree.
    Kill {
        tree: TreeId,
        grace: Option<Duration>,
        reason: KillReason,
        reply: oneshot::Sender<Option<PendingOutcome>>,
    },
    /// Apply `tree`'s policy for its root's exit, which was read from the ring buffer (and
    /// told) while another tree was being ended.
    ApplyRootExit {
        tree: TreeId,
        policy: RootExitPolicy,
    },
    /// Kill every tree, remove the pins, then reply.
    Shutdown { done: oneshot::Sender<()> },
    // Clients'.
    /// Take `tree` out of the maps (its entry is already out of the registry).
    Release {
        tree: TreeId,
        reply: oneshot::Sender<Result<(), kernel::Error>>,
    },
    /// Begin registering `process` (see `adoption`).
    StartAdoption {
        process: ProcessRef,
        nest_in: Option<TreeId>,
        holder: Holder,
        reply: oneshot::Sender<Result<Adoption, kernel::Error>>,
    },
    /// Seed into `tree` what a pass over /proc found, from `found[from]` on, for as long as
    /// one step may take (see `adoption`): how far it went, and how many are new members.
    Seed {
        tree: TreeId,
        found: Arc<[ProcessInfo]>,
        from: usize,
        reply: oneshot::Sender<Result<SeedStep, kernel::Error>>,
    },
    /// Take in what a pass of the descent iterator did for an adoption.
    AdmitDescended {
        tree: TreeId,
        reading: Reading,
        reply: oneshot::Sender<Result<usize, kernel::Error>>,
    },
    /// Give an adoption up.
    AbandonAdoption {
        adoption: Adoption,
        done: oneshot::Sender<()>,
    },
    /// Finish an adoption and file its tree.
    FileAdoption {
        adoption: Adoption,
        entry: TreeEntry,
        reservation: Reservation,
        reply: oneshot::Sender<Result<TreeId, Refusal>>,
    },
}

impl Command {
    /// Whether it goes ahead of every client's command.
    fn is_urgent(&self) -> bool {
        matches!(
            self,
            Self::EndLease { .. }
                | Self::WatchHost { .. }
                | Self::Kill { .. }
                | Self::ApplyRootExit { .. }
                | Self::Shutdown { .. }
        )
    }
}

/// The owner thread has stopped: the daemon is exiting.
#[derive(Debug)]
pub(in crate::daemon) struct Stopped;

impl From<Stopped> for Refusal {
    fn from(_: Stopped) -> Self {
        Self::new(ErrorCode::Internal, "the daemon is stopping")
    }
}

/// How the rest of the daemon hands commands to the owner.
pub(in crate::daemon) struct Jobs {
    urgent: mpsc::UnboundedSender<Command>,
    clients: mpsc::Sender<Command>,
}

/// The owner's ends of the queues.
pub(in crate::daemon) struct Queues {
    urgent: mpsc::UnboundedReceiver<Command>,
    clients: mpsc::Receiver<Command>,
}

pub(in crate::daemon) fn queues() -> (Jobs, Queues) {
    let (urgent, urgent_rx) = mpsc::unbounded_channel();
    let (clients, clients_rx) = mpsc::channel(QUEUED_COMMANDS);
    (
        Jobs { urgent, clients },
        Queues {
            urgent: urgent_rx,
            clients: clients_rx,
        },
    )
}

impl Queues {
    /// The next command: an urgent one if any waits, else a client's; None once both queues are
    /// closed.
    pub(in crate::daemon) async fn next(&mut self) -> Option<Command> {
        tokio::select! {
            biased;
            Some(command) = self.urgent.recv() => Some(command),
            Some(command) = self.clients.recv() => Some(command),
            else => None,
        }
    }
}

impl Jobs {
    /// Queues `command`. Urgent ones are never refused nor held up: they are enforcement's
    /// (their number is bounded by the connections and by the request rates). A client's waits
    /// for room in its queue.
    async fn send(&self, command: Command) -> Result<(), Stopped> {
        if command.is_urgent() {
            self.urgent.send(command).map_err(|_| Stopped)
        } else {
            self.clients.send(command).await.map_err(|_| Stopped)
        }
    }

    /// Queues the command `make` builds around a reply channel, and waits for the reply.
    async fn ask<R>(&self, make: impl FnOnce(oneshot::Sender<R>) -> Command) -> Result<R, Stopped> {
        let (reply, replied) = oneshot::channel();
        self.send(make(reply)).await?;
        replied.await.map_err(|_| Stopped)
    }

    /// Queues an urgent command without waiting for it. The owner is gone only when the daemon
    /// is exiting, and then there is nothing left to do.
    fn urgent(&self, command: Command) {
        debug_assert!(command.is_urgent());
        let _ = self.urgent.send(command);
    }

    /// Ends `lease` now: `triggers::end_lease` kills its trees, ahead of every client.
    pub(in crate::daemon) fn end_lease(&self, lease: LeaseId, reason: LeaseEnd) {
        self.urgent(Command::EndLease { lease, reason });
    }

    /// Watches the host of `lease`: `triggers::watch_host` ends the lease when the host
    /// exits, unless `until` closes first.
    pub(in crate::daemon) fn watch_host(
        &self,
        lease: LeaseId,
        host: OwnedFd,
        until: oneshot::Receiver<()>,
    ) {
        self.urgent(Command::WatchHost { lease, host, until });
    }

    /// Applies `tree`'s root-exit policy: `triggers::apply_root_exit` kills it or keeps it.
    pub(in crate::daemon) fn apply_root_exit(&self, tree: TreeId, policy: RootExitPolicy) {
        self.urgent(Command::ApplyRootExit { tree, policy });
    }

    /// Kills `tree`: `enforcement::start_kill` starts it (or shortens one under way), and
    /// answers with the outcome to wait on.
    pub(in crate::daemon) async fn kill(
        &self,
        tree: TreeId,
        grace: Option<Duration>,
        reason: KillReason,
    ) -> Result<Option<PendingOutcome>, Stopped> {
        self.ask(|reply| Command::Kill {
            tree,
            grace,
            reason,
            reply,
        })
        .await
    }

    /// Stops enforcing: `enforcement::kill_all` kills every tree, then the pins are removed.
    pub(in crate::daemon) async fn shutdown(&self) -> Result<(), Stopped> {
        self.ask(|done| Command::Shutdown { done }).await
    }

    /// Releases `tree`: `Tracker::release` takes it out of the maps.
    pub(in crate::daemon) async fn release(
        &self,
        tree: TreeId,
    ) -> Result<Result<(), kernel::Error>, Stopped> {
        self.ask(|reply| Command::Release { tree, reply }).await
    }

    /// Begins registering `process`: `Tracker::start_adoption` makes its tree and its
    /// first entry.
    pub(in crate::daemon) async fn start_adoption(
        &self,
        process: ProcessRef,
        nest_in: Option<TreeId>,
        holder: Holder,
    ) -> Result<Result<Adoption, kernel::Error>, Stopped> {
        self.ask(|reply| Command::StartAdoption {
            process,
            nest_in,
            holder,
            reply,
        })
        .await
    }

    /// One bounded step of seeding `found` into `tree`, from `from`: `adoption::seed_step`.
    pub(in crate::daemon) async fn seed(
        &self,
        tree: TreeId,
        found: Arc<[ProcessInfo]>,
        from: usize,
    ) -> Result<Result<SeedStep, kernel::Error>, Stopped> {
        self.ask(|reply| Command::Seed {
            tree,
            found,
            from,
            reply,
        })
        .await
    }

    /// Takes in what a descent pass put in `tree`: `Tracker::admit_descended`.
    pub(in crate::daemon) async fn admit_descended(
        &self,
        tree: TreeId,
        reading: Reading,
    ) -> Result<Result<usize, kernel::Error>, Stopped> {
        self.ask(|reply| Command::AdmitDescended {
            tree,
            reading,
            reply,
        })
        .await
    }

    /// Gives up an adoption that will not be filed: `Tracker::abandon_adoption` releases its
    /// tree.
    pub(in crate::daemon) async fn abandon_adoption(
        &self,
        adoption: Adoption,
    ) -> Result<(), Stopped> {
        self.ask(|done| Command::AbandonAdoption { adoption, done })
            .await
    }

    /// Files a finished adoption as a tree of the registry: `adoption::file`.
    pub(in crate::daemon) async fn file_adoption(
        &self,
        adoption: Adoption,
        entry: TreeEntry,
        reservation: Reservation,
    ) -> Result<Result<TreeId, Refusal>, Stopped> {
        self.ask(|reply| Command::FileAdoption {
            adoption,
            entry,
            reservation,
            reply,
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_of(command: Option<Command>) -> TreeId {
        match command {
            Some(Command::ApplyRootExit { tree, .. }) => tree,
            Some(Command::Release { tree, .. }) => tree,
            _ => panic!("an unexpected command"),
        }
    }

    #[tokio::test]
    async fn urgent_commands_go_ahead_of_clients_in_their_order() {
        let (jobs, mut queues) = queues();
        for tree in [1, 2] {
            let (reply, _) = oneshot::channel();
            jobs.send(Command::Release { tree, reply }).await.unwrap();
        }
        jobs.apply_root_exit(10, RootExitPolicy::Kill);
        jobs.apply_root_exit(11, RootExitPolicy::Keep);
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(tree_of(queues.next().await));
        }
        assert_eq!(seen, [10, 11, 1, 2]);
    }

    #[tokio::test]
    async fn a_stopped_owner_is_said_so() {
        let (jobs, queues) = queues();
        drop(queues);
        assert!(jobs.release(1).await.is_err());
        assert!(jobs.kill(1, None, KillReason::Request).await.is_err());
    }

    #[tokio::test]
    async fn the_queues_end_when_every_sender_is_gone() {
        let (jobs, mut queues) = queues();
        drop(jobs);
        assert!(queues.next().await.is_none());
    }

    #[test]
    fn enforcement_is_urgent_and_clients_are_not() {
        let (reply, _) = oneshot::channel();
        assert!(
            Command::Kill {
                tree: 1,
                grace: None,
                reason: KillReason::Request,
                reply
            }
            .is_urgent()
        );
        let (reply, _) = oneshot::channel();
        assert!(!Command::Release { tree: 1, reply }.is_urgent());
    }
}
