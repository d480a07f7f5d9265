//! Registering a running process with every descendant it has, as a daemon drives it: the
//! owner does the map work in steps bounded in time, while the /proc walks run on a blocking
//! thread (see `kernel::register` for why this is safe in pieces). Until its last step files
//! it, the tree is in no one's hands, so no kill and no release can come between the steps:
//! the last step sees whether its lease or the tree it is nested in ended meanwhile, and then
//! kills it.

use std::{
    rc::Rc,
    sync::Arc,
    time::{Duration, Instant},
};

use leash_client::protocol::{ErrorCode, TreeId};
use leash_common::{Holder, Pid};
use tokio::sync::mpsc;

use super::{enforcement::start_kill, triggers::watch_host_death};
use crate::{
    daemon::{
        rules::refusal::Refusal,
        state::{
            owner::Owner,
            registry::{Reservation, TreeEntry},
            shared::Daemon,
        },
    },
    kernel::{self, Adoption, Descent, SeedStep},
    proc::{self, ProcessInfo, ProcessRef},
};

/// How long one owner step seeds while a tree is adopted, at most (plus the one process under
/// way: tens of µs). A kill under way waits for at most one step at each of its turns on the
/// owner (its doom, its signal rounds, each wake-up of a pidfd, its last check), and an idle
/// kill takes ~5 ms over a few such turns: 1 ms steps keep a kill during an adoption within
/// twice that. Sized by time, not by count, since a process's cost varies tenfold with the
/// machine's load. Shorter steps would cost more than they give: each one is a round trip
/// between two threads, and seeds a few tens of processes.
const SEED_STEP: Duration = Duration::from_millis(1);

/// How many found processes a walk hands over at once: seeding begins while the walk goes on
/// (on another core), each batch a few seed steps.
const WALK_BATCH: usize = 256;

/// How many batches a walk may be ahead of their seeding: what waits in memory stays bounded.
const WALK_AHEAD: usize = 64;

/// Registers `process` as the root of a new tree with every descendant it has, nested in
/// `nest_in` if given, held by `holder`, and files it as `entry` in the place `reservation`
/// holds.
pub(in crate::daemon) async fn adopt(
    daemon: &Arc<Daemon>,
    process: ProcessRef,
    nest_in: Option<TreeId>,
    holder: Holder,
    entry: TreeEntry,
    reservation: Reservation,
) -> Result<TreeId, Refusal> {
    let jobs = &daemon.jobs;
    let mut adoption = jobs.start_adoption(process, nest_in, holder).await??;
    while adoption.wants_pass() {
        if let Err(e) = seed_pass(daemon, &mut adoption).await {
            jobs.abandon_adoption(adoption).await?;
            return Err(e);
        }
    }
    jobs.file_adoption(adoption, entry, reservation).await?
}

/// One pass of an adoption: by the descent iterator where it attached, or else by a walk of
/// /proc.
async fn seed_pass(daemon: &Arc<Daemon>, adoption: &mut Adoption) -> Result<(), Refusal> {
    match &daemon.descent {
        Some(descent) => descent_pass(daemon, descent.clone(), adoption).await,
        None => proc_pass(daemon, adoption).await,
    }
}

/// One pass of an adoption by the descent iterator, which puts the descendants in as it finds
/// them, in the kernel, on a blocking thread (it walks every task: tens of ms for 100k); the
/// owner then takes in what it did, in one short step.
async fn descent_pass(
    daemon: &Arc<Daemon>,
    descent: Arc<Descent>,
    adoption: &mut Adoption,
) -> Result<(), Refusal> {
    let (tree, enclosing) = (adoption.tree(), adoption.enclosing());
    let started = Instant::now();
    let _turn = daemon
        .descent_turn
        .acquire()
        .await
        .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?;
    let reading = tokio::task::spawn_blocking(move || descent.adopt(tree, enclosing))
        .await
        .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?
        .map_err(kernel::Error::Maps)?;
    let found = reading.found.len();
    let new = daemon.jobs.admit_descended(tree, reading).await??;
    tracing::debug!(
        tree,
        found,
        new,
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        "adoption pass (descent)"
    );
    Ok(adoption.end_pass(new)?)
}

/// One pass of an adoption by /proc: the descendants are found on a blocking thread, and what
/// it finds is seeded by the owner, in steps of [`SEED_STEP`], while the walk goes on.
async fn proc_pass(daemon: &Arc<Daemon>, adoption: &mut Adoption) -> Result<(), Refusal> {
    let (tree, root) = (adoption.tree(), adoption.root());
    let started = Instant::now();
    let (batches, mut found) = mpsc::channel(WALK_AHEAD);
    let walking = {
        let daemon = daemon.clone();
        tokio::task::spawn_blocking(move || {
            let deliver = |batch| batches.blocking_send(batch).is_ok();
            daemon
                .view
                .find_descendants_in_batches(tree, root, WALK_BATCH, deliver)
        })
    };
    let seeded = seed_batches(daemon, tree, &mut found).await;
    // A walk still going (the seeding failed) stops at its next batch.
    drop(found);
    let walk = walking
        .await
        .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?
        .map_err(kernel::Error::Maps)?;
    let (seeded, steps) = seeded?;
    adoption.searched(&walk);
    adoption.count_proc_reads(seeded.proc_reads);
    tracing::debug!(
        tree,
        found = walk.found,
        new = seeded.new,
        proc_reads = walk.proc_reads + seeded.proc_reads,
        took_ms = started.elapsed().as_secs_f64() * 1e3,
        steps,
        "adoption pass"
    );
    Ok(adoption.end_pass(seeded.new)?)
}

/// Seeds every batch a walk hands over into `tree`, each in as many owner steps as it takes:
/// what they did in all, and how many steps.
async fn seed_batches(
    daemon: &Daemon,
    tree: TreeId,
    found: &mut mpsc::Receiver<Vec<ProcessInfo>>,
) -> Result<(SeedStep, usize), Refusal> {
    let (mut seeded, mut steps) = (SeedStep::default(), 0);
    while let Some(batch) = found.recv().await {
        let batch: Arc<[ProcessInfo]> = batch.into();
        let mut from = 0;
        while from < batch.len() {
            let step = daemon.jobs.seed(tree, batch.clone(), from).await??;
            if step.taken == 0 {
                return Err(Refusal::new(
                    ErrorCode::Internal,
                    "a seed step took nothing",
                ));
            }
            from += step.taken;
            steps += 1;
            seeded.taken += step.taken;
            seeded.new += step.new;
            seeded.proc_reads += step.proc_reads;
        }
    }
    Ok((seeded, steps))
}

/// One step of seeding, on the owner: what `found` holds from `from` on, for [`SEED_STEP`].
pub(in crate::daemon) fn seed_step(
    owner: &Rc<Owner>,
    tree: TreeId,
    found: &[ProcessInfo],
    from: usize,
) -> Result<SeedStep, kernel::Error> {
    let rest = found.get(from..).unwrap_or_default();
    let deadline = Instant::now() + SEED_STEP;
    owner.tracker().seed_until(tree, rest, Some(deadline))
}

/// The last step of an adoption, on the owner: the tree is registered and filed. If its lease
/// ended meanwhile, or the tree it is nested in is being killed or is gone, it is killed now:
/// what it took from that tree was out of that tree's kill.
pub(in crate::daemon) fn file(
    owner: &Rc<Owner>,
    adoption: Adoption,
    entry: TreeEntry,
    reservation: Reservation,
) -> Result<TreeId, Refusal> {
    let enclosing = adoption.enclosing();
    let tree = owner.tracker().finish_adoption(adoption)?;
    let lease = entry.lease;
    match owner
        .daemon
        .registry
        .file(tree, entry, enclosing, reservation)
    {
        None => {
            watch_host_death(owner, lease);
            Ok(tree)
        }
        Some(reason) => {
            start_kill(owner, tree, None, reason);
            Err(Refusal::new(
                ErrorCode::NotFound,
                format!("tree {tree} was killed as it was registered ({reason})"),
            ))
        }
    }
}

/// The numbers process `pid` has in each pid namespace it is in (just `pid` if they cannot be
/// read): what names a tree's root to clients in containers, even after it has exited.
pub(in crate::daemon) fn root_numbers(pid: Pid) -> Box<[Pid]> {
    proc::namespace_pids(pid)
        .filter(|numbers| numbers.first() == Some(&pid))
        .unwrap_or_else(|| vec![pid])
        .into()
}
