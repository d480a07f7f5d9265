//! Registering a running process with every descendant it has, as a daemon drives it: the
//! owner does the map work in short steps, the /proc walks between them run on a blocking
//! thread (see `kernel::register` for why this is safe in pieces). Until its last step files
//! it, the tree is in no one's hands, so no kill and no release can come between the steps:
//! the last step sees whether its lease or the tree it is nested in ended meanwhile, and then
//! kills it.

use std::{rc::Rc, sync::Arc};

use leash_client::protocol::{ErrorCode, TreeId};
use leash_common::{Holder, Pid};

use super::{
    enforcement::start_kill,
    owner::Owner,
    refusal::Refusal,
    registry::{Reservation, TreeEntry},
    shared::Daemon,
};
use crate::{
    kernel::{self, Adoption},
    proc::{self, ProcessRef},
};

/// Processes one owner step seeds while a tree is adopted: a short step (a few ms: a kill under
/// way waits for at most one such step between its own).
const SEED_CHUNK: usize = 64;

/// Registers `process` as the root of a new tree with every descendant it has, nested in
/// `nest_in` if given, held by `holder`, and files it as `entry` in the place `reservation`
/// holds.
pub(super) async fn adopt(
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

/// One pass of an adoption: /proc is walked on a blocking thread, what it found is seeded by
/// the owner in short chunks.
async fn seed_pass(daemon: &Arc<Daemon>, adoption: &mut Adoption) -> Result<(), Refusal> {
    let (tree, root) = (adoption.tree(), adoption.root());
    let walk = {
        let daemon = daemon.clone();
        tokio::task::spawn_blocking(move || daemon.view.find_descendants(tree, root))
            .await
            .map_err(|e| Refusal::new(ErrorCode::Internal, e.to_string()))?
            .map_err(kernel::Error::Maps)?
    };
    adoption.searched(&walk.counts);
    let mut new = 0;
    for chunk in walk.found.chunks(SEED_CHUNK) {
        new += daemon.jobs.seed(tree, chunk.to_vec()).await??;
    }
    Ok(adoption.end_pass(new)?)
}

/// The last step of an adoption, on the owner: the tree is registered and filed. If its lease
/// ended meanwhile, or the tree it is nested in is being killed or is gone, it is killed now:
/// what it took from that tree was out of that tree's kill.
pub(super) fn file(
    owner: &Rc<Owner>,
    adoption: Adoption,
    entry: TreeEntry,
    reservation: Reservation,
) -> Result<TreeId, Refusal> {
    let enclosing = adoption.enclosing();
    let tree = owner.tracker().finish_adoption(adoption)?;
    match owner
        .daemon
        .registry
        .file(tree, entry, enclosing, reservation)
    {
        None => Ok(tree),
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
pub(super) fn root_numbers(pid: Pid) -> Box<[Pid]> {
    proc::namespace_pids(pid)
        .filter(|numbers| numbers.first() == Some(&pid))
        .unwrap_or_else(|| vec![pid])
        .into()
}
