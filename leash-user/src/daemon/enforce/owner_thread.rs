//! The tracker's one owner: a thread of its own, with its own runtime, so that no client's load
//! can hold up enforcement. It runs the event watch, the sweep and every kill, and between their
//! steps, one command at a time from the rest of the daemon (see `commands`), urgent ones
//! first.
//!
//! The thread runs at a higher priority than the connections' threads: under a flood that
//! keeps every core busy, the kernel still gives enforcement its turn first.

use std::{io, rc::Rc, sync::Arc};

use leash_client::protocol::KillReason;
use tokio::task::LocalSet;

use super::{adoption, enforcement, recover, triggers};
use crate::{
    daemon::state::{
        commands::{Command, Queues},
        owner::Owner,
        shared::Daemon,
    },
    kernel::Tracker,
    sys,
};

/// The owner thread's nice value: ahead of the connections' threads (0).
const OWNER_NICE: i32 = -10;

/// Starts the owner thread with `tracker`. Taken over from pins, it first holds the previous
/// daemon's trees again, and this returns once it has: a client served before then would find
/// its trees missing.
pub(in crate::daemon) fn start(
    daemon: Arc<Daemon>,
    tracker: Tracker,
    queues: Queues,
    taken_over: bool,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (held, trees_held) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("leash-owner".to_owned())
        .spawn(move || {
            if let Err(e) = sys::set_thread_nice(OWNER_NICE) {
                tracing::warn!("cannot raise the enforcement thread's priority: {e}");
            }
            let serving = serve(daemon, tracker, queues, taken_over, held);
            LocalSet::new().block_on(&runtime, serving);
        })?;
    // An error: the thread ended without a word, and the daemon finds out as it asks it.
    let _ = trees_held.recv();
    Ok(())
}

async fn serve(
    daemon: Arc<Daemon>,
    tracker: Tracker,
    mut queues: Queues,
    taken_over: bool,
    held: std::sync::mpsc::SyncSender<()>,
) {
    let owner = Rc::new(Owner::new(daemon, tracker));
    if taken_over {
        recover::hold_again(&owner);
        // Its passes over the maps and /proc are garbage now: given back with the next trim.
        owner.daemon.memory_freed();
    }
    let _ = held.send(());
    tokio::task::spawn_local(triggers::watch_events(owner.clone()));
    tokio::task::spawn_local(triggers::sweep(owner.clone()));
    while let Some(command) = queues.next().await {
        execute(&owner, command);
        // Kill steps, root exits and the sweep take their turn between any two commands.
        tokio::task::yield_now().await;
    }
}

/// Runs one command: a bounded step, or the start of a task that takes its turns.
fn execute(owner: &Rc<Owner>, command: Command) {
    match command {
        Command::EndLease { lease, reason } => triggers::end_lease(owner, lease, reason),
        Command::WatchHost { lease, host, until } => {
            triggers::watch_host(owner, lease, host, Some(until));
        }
        Command::Kill {
            tree,
            grace,
            reason,
            reply,
        } => {
            let _ = reply.send(enforcement::start_kill(owner, tree, grace, reason));
        }
        Command::ApplyRootExit { tree, policy } => triggers::apply_root_exit(owner, tree, policy),
        Command::Shutdown { done } => {
            let owner = owner.clone();
            tokio::task::spawn_local(async move {
                enforcement::kill_all(&owner, KillReason::Shutdown).await;
                // Nothing is left to track: the next daemon starts afresh.
                if let Err(e) = owner.tracker().unpin() {
                    tracing::warn!("removing the pins: {e:#}");
                }
                let _ = done.send(());
            });
        }
        Command::Release { tree, reply } => {
            let _ = reply.send(owner.tracker().release(tree));
        }
        Command::StartAdoption {
            process,
            nest_in,
            holder,
            reply,
        } => {
            let started = owner.tracker().start_adoption(process, nest_in, holder);
            let _ = reply.send(started);
        }
        Command::Seed {
            tree,
            found,
            from,
            reply,
        } => {
            let _ = reply.send(adoption::seed_step(owner, tree, &found, from));
        }
        Command::AdmitDescended {
            tree,
            reading,
            reply,
        } => {
            let _ = reply.send(owner.tracker().admit_descended(tree, &reading));
        }
        Command::AbandonAdoption { adoption, done } => {
            owner.tracker().abandon_adoption(adoption);
            let _ = done.send(());
        }
        Command::FileAdoption {
            adoption,
            entry,
            reservation,
            reply,
        } => {
            let _ = reply.send(adoption::file(owner, adoption, entry, reservation));
        }
    }
}
