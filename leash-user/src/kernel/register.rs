//! Registering a tree without a gap. The programs are attached before anything is registered,
//! so once a process is in the member map every fork it makes is followed by the kernel. What
//! user space must do is put the root in, then every descendant that already exists, and look
//! again until a pass finds nothing new: anything forked after its parent went in was added by
//! the kernel, and anything forked before shows up in the next /proc walk.

use std::process::{Child, Command};

use anyhow::{Context, Result, bail};
use leash_common::{Holder, Member, Pid, TreeId};

use super::{BPF_EXIST, BPF_NOEXIST, Tracker};
use crate::{
    proc::{self, ProcessInfo, ProcessRef},
    sys::{self, Pidfd, SpawnHeldError},
};

/// More passes than this means descendants appear faster than /proc can be read.
const MAX_SEED_PASSES: usize = 64;

impl Tracker {
    /// Registers the running process `pid` as the root of a new tree, with all of its
    /// descendants (see [`Tracker::adopt_process`]).
    pub fn adopt(&mut self, pid: Pid) -> Result<TreeId> {
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
    ) -> Result<TreeId> {
        let enclosing = match self.member(root.pid) {
            Some(member) if proc::ns_to_ticks(member.start_ns) == root.start_ticks => {
                Some(member.tree)
            }
            // An entry for an earlier process by that pid: refuse rather than guess.
            Some(member) => bail!(
                "pid {} is held by tree {} for a process that is gone",
                root.pid,
                member.tree
            ),
            None => nest_in,
        };
        let info = proc::process(root.pid)
            .filter(|p| p.start_ticks == root.start_ticks)
            .with_context(|| format!("process {} exited", root.pid))?;
        let tree = self.new_tree(root.pid, enclosing, holder)?;
        match self.adopt_into(tree, &info) {
            Ok(seeded) => {
                tracing::info!(tree, root = root.pid, ?enclosing, seeded, "tree registered");
                Ok(tree)
            }
            Err(e) => {
                let _ = self.release(tree);
                Err(e)
            }
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
                })
            }
        }
    }

    fn adopt_into(&mut self, tree: TreeId, root: &ProcessInfo) -> Result<u64> {
        if !self.seed(tree, root)? {
            bail!("process {} is exiting", root.pid);
        }
        // A root with no children now has no descendants to find: any it forks from now on
        // joins in the kernel. (A fresh process, as `spawn` makes, needs no /proc walk, whose
        // cost grows with every process on the machine.)
        if proc::is_childless(root.pid) {
            return Ok(1);
        }
        let enclosing = self.tree_status(tree)?.parent;
        let mut seeded = 1;
        for _ in 0..MAX_SEED_PASSES {
            let snapshot = proc::all_processes().context("walking /proc")?;
            // Below a process that belongs to another tree, its own tree follows it (members
            // of the enclosing tree come down into this one).
            let descendants = proc::descendants(&snapshot, root.pid, |p| {
                self.member(p.pid)
                    .is_some_and(|m| m.tree != tree && Some(m.tree) != enclosing)
            });
            let mut new = 0;
            for process in descendants {
                let held = self.member(process.pid).map(|m| m.tree);
                if held != Some(tree) && self.seed(tree, process)? {
                    new += 1;
                }
            }
            if new == 0 {
                return Ok(seeded);
            }
            seeded += new;
        }
        bail!(
            "the tree of {} kept growing faster than /proc could be read",
            root.pid
        )
    }

    /// Puts one process found in /proc into `tree`: a process no tree holds, or a member of
    /// the tree `tree` is nested in, which comes down into it. Returns whether it is now a
    /// member counted in `seeded`.
    ///
    /// A new entry races with the process's exit, which is settled here: the kernel removes
    /// only what is in the map when the thread group dies, so the entry stays only if, after
    /// it was made, the pid still names the same process (start time) and some thread of it
    /// has not begun exiting. Otherwise the entry is taken out again: left in, it would name
    /// whatever process gets the pid next.
    fn seed(&mut self, tree: TreeId, process: &ProcessInfo) -> Result<bool> {
        if let Some(current) = self.member(process.pid) {
            return self.move_down(tree, process, current);
        }
        let member = Member {
            tree,
            parent: process.ppid,
            start_ns: proc::ticks_to_ns(process.start_ticks),
        };
        if self
            .members
            .insert(process.pid, member, BPF_NOEXIST)
            .is_err()
        {
            // Already a member: the kernel saw it forked from a member first.
            return Ok(false);
        }
        // The same process, alive after the insert: its group's death, whenever it comes, finds
        // the entry (see proc::group_alive).
        let still_there = proc::alive_start(process.pid) == Some(process.start_ticks);
        if still_there {
            self.add_seeded(tree, 1)?;
            return Ok(true);
        }
        if self.members.remove(&process.pid).is_err() {
            // The program removed it: it died after the insert and was counted as left.
            // Count it as seeded too, so seeded + joined - left stays true.
            self.add_seeded(tree, 1)?;
        }
        Ok(false)
    }

    /// Moves a member of the enclosing tree into `tree`, nested in it.
    fn move_down(&mut self, tree: TreeId, process: &ProcessInfo, current: Member) -> Result<bool> {
        let enclosing = self.tree_status(tree)?.parent;
        let same = proc::ns_to_ticks(current.start_ns) == process.start_ticks;
        if Some(current.tree) != enclosing || !same {
            return Ok(false);
        }
        // Only if the entry is still there: one gone with its process stays gone.
        let moved = Member { tree, ..current };
        if self.members.insert(process.pid, moved, BPF_EXIST).is_err() {
            return Ok(false);
        }
        self.add_seeded(current.tree, -1)?;
        self.add_seeded(tree, 1)?;
        Ok(true)
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
        Err(e) => return Err(IdentifyError::Io(pid, e.to_string())),
    };
    // Read after the pidfd was opened, and before it is checked: if the process it names is
    // still running now, the pid named it all along, so what was read is its.
    let start_ticks = proc::alive_start(pid);
    match start_ticks {
        Some(start_ticks) if !pidfd.has_exited() => Ok((ProcessRef { pid, start_ticks }, pidfd)),
        _ => Err(IdentifyError::Exiting(pid)),
    }
}

/// Why a pid cannot be registered.
#[derive(Debug, thiserror::Error)]
pub enum IdentifyError {
    #[error("no process {0}")]
    NotFound(Pid),
    #[error("{tid} is a thread of process {tgid}, not a process: register {tgid}")]
    Thread { tid: Pid, tgid: Pid },
    #[error("process {0} is exiting")]
    Exiting(Pid),
    #[error("cannot open process {0}: {1}")]
    Io(Pid, String),
}
