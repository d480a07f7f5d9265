//! Registering a tree without a gap. The programs are attached before anything is registered,
//! so once a process is in the member map every fork it makes is followed by the kernel. What
//! user space must do is put the root in, then every descendant that already exists, and look
//! again until a pass finds nothing new: anything forked after its parent went in was added by
//! the kernel, and anything forked before shows up in the next /proc walk.
//!
//! Adopting a running process is split so that its slow part, the /proc walk, needs no writer
//! and other work can run between the writer's short calls: [`Tracker::start_adoption`] makes
//! the tree and seeds the root; each pass is a [`find_descendants`] (read-only, on any thread),
//! then [`Tracker::seed_until`] in steps as short as wanted over what it found (while the
//! walk goes on, if wanted), then [`Adoption::end_pass`], which says whether another pass is
//! needed. Each pass's search begins after the previous pass's seeds are done. This is as safe as one long call, because nothing it relies on holds only
//! while the calls run back to back:
//! - the tree is in the kernel maps from `start_adoption` on, so every fork of a seeded member
//!   is followed by the kernel, whatever runs between the calls;
//! - a descendant found in /proc is seeded with the checks it always had, made when it is
//!   seeded (same start time, still alive, held by no tree but the enclosing one): an aged
//!   snapshot only means that some of what it shows is skipped;
//! - the search ends with a pass that finds nothing new and reads every member steadily (see
//!   `proc::descendants_of`): every process then in the root's subtree is a member, or was
//!   forked from one after it joined, which the kernel followed. A process found and seeded
//!   in a pass is new, so another pass follows, in which it is a member, read with care.
//!
//! [`find_descendants`]: super::TrackerView::find_descendants

mod seed;
#[cfg(test)]
mod tests;

use std::{
    os::fd::AsFd,
    process::{Child, Command},
};

use anyhow::{Context, Result, bail};
use leash_common::{Holder, Pid, TreeId};
pub use seed::SeedStep;

use super::{
    descent::{Reading, Stopped},
    error::{Error, IdentifyError},
    tracker::Tracker,
};
use crate::{
    proc::{self, ProcessRef, WalkCounts},
    sys::{self, Pidfd, SpawnHeldError},
};

/// More passes than this means descendants appear faster than /proc can be read.
const MAX_SEED_PASSES: usize = 64;

impl Tracker {
    /// Registers the running process `pid` as the root of a new tree, with all of its
    /// descendants (see [`Tracker::adopt_process`]).
    pub fn adopt(&mut self, pid: Pid) -> Result<TreeId, Error> {
        let root = identify(pid)?;
        self.adopt_process(root.0, None, Holder::default())
    }

    /// Registers the running process `root` as the root of a new tree, with all of its
    /// descendants. A descendant that was double-forked away *before* this call (reparented
    /// out of the root's subtree) cannot be found; everything forked after is.
    ///
    /// A process that is a member of a tree already stays inside it: the new tree is nested in
    /// that tree, taking the process and its descendants there with it. Otherwise the new tree
    /// is nested in `nest_in` if given (the tree of the host that asks), or stands alone.
    /// `holder` is recorded with it (who holds it, what it asked for; its owner's quota).
    pub fn adopt_process(
        &mut self,
        root: ProcessRef,
        nest_in: Option<TreeId>,
        holder: Holder,
    ) -> Result<TreeId, Error> {
        let mut adoption = self.start_adoption(root, nest_in, holder)?;
        let descent = self.descent();
        while adoption.wants_pass() {
            if let Some(descent) = &descent {
                let pass = descent
                    .adopt(adoption.tree(), adoption.enclosing())
                    .map_err(Error::Maps)
                    .and_then(|reading| {
                        let new = self.admit_descended(adoption.tree(), &reading)?;
                        adoption.end_pass(new)
                    });
                if let Err(e) = pass {
                    self.abandon_adoption(adoption);
                    return Err(e);
                }
                continue;
            }
            let pass = self
                .find_descendants(adoption.tree(), adoption.root())
                .map_err(Error::Maps)
                .and_then(|walk| {
                    adoption.searched(&walk.counts);
                    self.seed_until(adoption.tree(), &walk.found, None)
                })
                .and_then(|step| {
                    adoption.count_proc_reads(step.proc_reads);
                    adoption.end_pass(step.new)
                });
            if let Err(e) = pass {
                self.abandon_adoption(adoption);
                return Err(e);
            }
        }
        self.finish_adoption(adoption)
    }

    /// Begins registering the running process `root` as the root of a new tree (see
    /// [`Tracker::adopt_process`] for where the tree is nested): makes the tree and seeds the
    /// root. Then, while [`Adoption::wants_pass`], a pass: [`find_descendants`] (counted with
    /// [`Adoption::searched`]), [`Tracker::seed_until`] (in steps as short as wanted) and
    /// [`Adoption::end_pass`]; then [`Tracker::finish_adoption`], or
    /// [`Tracker::abandon_adoption`] on any failure. On error here, nothing is registered.
    ///
    /// [`find_descendants`]: super::TrackerView::find_descendants
    pub fn start_adoption(
        &mut self,
        root: ProcessRef,
        nest_in: Option<TreeId>,
        holder: Holder,
    ) -> Result<Adoption, Error> {
        let enclosing = match self.member(root.pid) {
            Some(member) if root.is(&member) => Some(member.tree),
            // An entry for an earlier process by that pid: refuse rather than guess.
            Some(member) => {
                return Err(Error::StaleMember {
                    pid: root.pid,
                    tree: member.tree,
                });
            }
            None => nest_in,
        };
        let info = proc::process(root.pid)
            .filter(|p| p.start_ticks == root.start_ticks)
            .ok_or(Error::Exited(root.pid))?;
        let tree = self.new_tree(root.pid, enclosing, holder)?;
        match self.seed(tree, &info) {
            Ok(true) => {}
            seeded => {
                let _ = self.release(tree);
                seeded?;
                return Err(Error::Exiting(root.pid));
            }
        }
        // A root with no children now has no descendants to find: any it forks from now on
        // joins in the kernel. (A fresh process, as `spawn` makes, needs no /proc walk, whose
        // cost grows with every process on the machine.)
        let childless = proc::is_childless(root.pid);
        Ok(Adoption {
            tree,
            root: root.pid,
            enclosing,
            seeded: 1,
            passes: 0,
            searching: !childless,
            unsettled: false,
            found: 0,
            proc_reads: 0,
        })
    }

    /// Takes in what a pass of the descent iterator did for the adoption of `tree` (see
    /// `kernel::descent`): the processes it put in go into the index, and the marks follow the
    /// member map. Returns how many it put in or moved: the pass's new members. Fails if it
    /// stopped early, for want of room or because the tree is doomed.
    pub fn admit_descended(&mut self, tree: TreeId, reading: &Reading) -> Result<usize, Error> {
        for found in &reading.found {
            if found.from != 0 {
                self.view.index.remove(found.from, found.pid);
            }
            self.view.index.admit(found.tree, found.pid);
        }
        // Counted as seeded, as what user space puts in is (the accounts were counted in the
        // kernel, as it went), also when the reading stopped early: what it put in until then
        // is in the tree, and a release of the tree counts it out.
        let new = i64::from(reading.added) + i64::from(reading.moved);
        self.add_seeded_to_tree(tree, new)?;
        if reading.moved > 0 {
            let enclosing = self.tree_status(tree)?.parent;
            if let Some(enclosing) = enclosing {
                self.add_seeded_to_tree(enclosing, -i64::from(reading.moved))?;
            }
        }
        match reading.stopped {
            Some(Stopped::Full) => return Err(Error::MembersFull(self.capacity().members)),
            Some(Stopped::Doomed) => return Err(Error::Doomed(tree)),
            None => {}
        }
        if new > 0 && self.marks.is_some() {
            // Marks where they are in place: an adopted process's threads and children are
            // marked in the kernel from its entry until then, so this only speeds the kill.
            self.reconcile_now()?;
        }
        Ok(new as usize)
    }

    /// Ends an adoption whose search is over: the tree is registered.
    pub fn finish_adoption(&mut self, adoption: Adoption) -> Result<TreeId, Error> {
        if adoption.wants_pass() {
            let tree = adoption.tree;
            self.abandon_adoption(adoption);
            return Err(Error::Unfinished(tree));
        }
        let Adoption {
            tree,
            root,
            enclosing,
            seeded,
            passes,
            found,
            proc_reads,
            ..
        } = adoption;
        // DEBUG: the daemon's INFO line (`tree_registered`) names the lease and the owner too.
        // The /proc reads per member say what the walks cost beside the time it took.
        let proc_reads_per_member = proc_reads as f64 / seeded as f64;
        tracing::debug!(
            tree,
            root,
            enclosing,
            seeded,
            passes,
            found,
            proc_reads,
            proc_reads_per_member,
            "adoption finished"
        );
        Ok(tree)
    }

    /// Gives up an adoption: releases its tree (its members go back where they were, or free).
    pub fn abandon_adoption(&mut self, adoption: Adoption) {
        if let Err(e) = self.release(adoption.tree) {
            tracing::warn!(
                tree = adoption.tree,
                "releasing an abandoned adoption: {}",
                e.with_causes()
            );
        }
    }

    /// Starts `command` as the root of a new tree. The child is held between fork and exec
    /// until it is in the member map: it runs nothing of the command untracked.
    pub fn spawn(&mut self, command: &mut Command) -> Result<(TreeId, Child)> {
        let mut registered = None;
        let spawned = sys::spawn_held(command, |pid| -> Result<()> {
            let root = proc::process(pid).context("the held child vanished")?;
            let tree = self.new_tree(pid, None, Holder::default())?;
            registered = Some(tree);
            if !self.seed(tree, &root)? {
                bail!("the held child could not be registered");
            }
            Ok(())
        });
        match (spawned, registered) {
            (Ok(child), Some(tree)) => {
                tracing::info!(tree, root = child.id(), "spawned under a new tree");
                Ok((tree, child))
            }
            (Ok(_), None) => unreachable!("spawn_held runs the registration before exec"),
            (Err(e), tree) => {
                if let Some(tree) = tree {
                    let _ = self.release(tree);
                }
                Err(match e {
                    SpawnHeldError::Spawn(e) => anyhow::Error::new(e)
                        .context(format!("starting {:?}", command.get_program())),
                    SpawnHeldError::Register(e) => e.context("registering the new process"),
                    thread @ SpawnHeldError::Thread(_) => anyhow::Error::msg(thread.to_string()),
                })
            }
        }
    }
}

/// A registration of a running process under way (see [`Tracker::start_adoption`]). Its tree
/// and root are in the maps; the root's existing descendants are sought in passes over /proc
/// until a pass finds none new.
#[derive(Debug)]
#[must_use = "an adoption is finished or abandoned"]
pub struct Adoption {
    tree: TreeId,
    root: Pid,
    enclosing: Option<TreeId>,
    /// Members seeded so far, the root included.
    seeded: usize,
    passes: usize,
    /// Whether another pass is needed.
    searching: bool,
    /// Whether this pass's walk read some member unsteadily: it proves nothing.
    unsettled: bool,
    /// Processes the passes' walks found, over all passes.
    found: usize,
    /// Files of /proc read, by the walks and by the checks of what they found.
    proc_reads: u64,
}

impl Adoption {
    pub fn tree(&self) -> TreeId {
        self.tree
    }

    pub fn root(&self) -> Pid {
        self.root
    }

    /// The tree the new one is nested in, if any.
    pub fn enclosing(&self) -> Option<TreeId> {
        self.enclosing
    }

    /// Members seeded so far, the root included.
    pub fn seeded(&self) -> usize {
        self.seeded
    }

    /// Whether another pass over /proc is needed: the root had children, and the last pass
    /// found new descendants.
    pub fn wants_pass(&self) -> bool {
        self.searching
    }

    /// Counts a pass's walk.
    pub fn searched(&mut self, walk: &WalkCounts) {
        self.found += walk.found;
        self.proc_reads += walk.proc_reads;
        self.unsettled |= walk.unsettled > 0;
    }

    /// Counts files of /proc read to check what a walk found (see [`SeedStep`]).
    pub fn count_proc_reads(&mut self, reads: u64) {
        self.proc_reads += reads;
    }

    /// Ends a pass that seeded `new` processes. A pass that seeded none, and whose walk read
    /// every member steadily, ends the search. Fails when passes go on finding new ones:
    /// descendants appear faster than /proc can be read (the adoption is then to be
    /// abandoned).
    pub fn end_pass(&mut self, new: usize) -> Result<(), Error> {
        self.passes += 1;
        self.seeded += new;
        let proven = !std::mem::take(&mut self.unsettled);
        if new == 0 && proven {
            self.searching = false;
            return Ok(());
        }
        if self.passes >= MAX_SEED_PASSES {
            return Err(Error::Runaway(self.root));
        }
        Ok(())
    }
}

/// The process `pid` names, if it is one that may be registered: a live thread group, named
/// by its thread group id (a thread's id is refused: the programs key members by process).
/// Returns it with a pidfd that holds it.
pub fn identify(pid: Pid) -> Result<(ProcessRef, Pidfd), IdentifyError> {
    let pidfd = match Pidfd::open(pid) {
        Ok(pidfd) => pidfd,
        // A thread's id: EINVAL, or ENOENT on newer kernels.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {
            return Err(match proc::thread_group_of(pid) {
                Some(tgid) if tgid != pid => IdentifyError::Thread { tid: pid, tgid },
                _ => IdentifyError::NotFound(pid),
            });
        }
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
            return Err(IdentifyError::NotFound(pid));
        }
        Err(source) => return Err(IdentifyError::Io { pid, source }),
    };
    // Read after the pidfd was opened, and before it is checked: if the process it names is
    // still running now, the pid named it all along, so what was read is its.
    let start_ticks = proc::alive_start(pid);
    match start_ticks {
        Some(start_ticks) if !pidfd.has_exited() => Ok((ProcessRef { pid, start_ticks }, pidfd)),
        _ => Err(IdentifyError::Exiting(pid)),
    }
}

/// The process a pidfd a client sent names, if it is one that may be registered (as for
/// [`identify`]). The pidfd names it whatever pid namespace the client runs in; its pid here is
/// read from the pidfd itself.
pub fn identify_pidfd(pidfd: Pidfd) -> Result<(ProcessRef, Pidfd), IdentifyError> {
    let pid = match proc::pidfd_pid(pidfd.as_fd()) {
        None => return Err(IdentifyError::NotPidfd),
        Some(pid) => match Pid::try_from(pid) {
            Ok(pid) if pid > 0 => pid,
            _ if pidfd.has_exited() => return Err(IdentifyError::Gone),
            _ => return Err(IdentifyError::Invisible),
        },
    };
    if let Some(tgid) = proc::thread_group_of(pid).filter(|&tgid| tgid != pid) {
        return Err(IdentifyError::Thread { tid: pid, tgid });
    }
    // As in identify: read after the pidfd named the process, and taken as its if the process
    // still runs after the read.
    match proc::alive_start(pid) {
        Some(start_ticks) if !pidfd.has_exited() => Ok((ProcessRef { pid, start_ticks }, pidfd)),
        _ => Err(IdentifyError::Exiting(pid)),
    }
}
