//! Registering a tree without a gap. The programs are attached before anything is registered,
//! so once a process is in the member map every fork it makes is followed by the kernel. What
//! user space must do is put the root in, then every descendant that already exists, and look
//! again until a pass finds nothing new: anything forked after its parent went in was added by
//! the kernel, and anything forked before shows up in the next /proc walk.

use std::process::{Child, Command};

use anyhow::{Context, Result, bail};
use leash_common::{Member, Pid, TreeId};

use super::{BPF_NOEXIST, Tracker};
use crate::{
    proc::{self, ProcessInfo},
    sys::{self, SpawnHeldError},
};

/// More passes than this means descendants appear faster than /proc can be read.
const MAX_SEED_PASSES: usize = 64;

impl Tracker {
    /// Registers the running process `pid` as the root of a new tree, with all of its
    /// descendants. A descendant that was double-forked away *before* this call (reparented
    /// out of the root's subtree) cannot be found; everything forked after is.
    pub fn adopt(&mut self, pid: Pid) -> Result<TreeId> {
        let root = proc::process(pid)
            .filter(ProcessInfo::is_live)
            .with_context(|| format!("no running process {pid}"))?;
        if let Some(member) = self.member(pid) {
            bail!("process {pid} is already a member of tree {}", member.tree);
        }
        let tree = self.new_tree(pid)?;
        let adopted = self.adopt_into(tree, &root);
        match adopted {
            Ok(seeded) => {
                tracing::info!(tree, root = pid, seeded, "tree registered");
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
            let tree = self.new_tree(pid)?;
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
            bail!("process {} exited while it was being registered", root.pid);
        }
        // A root with no children now has no descendants to find: any it forks from now on
        // joins in the kernel. (A fresh process, as `spawn` makes, needs no /proc walk, whose
        // cost grows with every process on the machine.)
        if proc::is_childless(root.pid) {
            return Ok(1);
        }
        let mut seeded = 1;
        for _ in 0..MAX_SEED_PASSES {
            let snapshot = proc::all_processes().context("walking /proc")?;
            // Below a process that belongs to another tree, its own tree follows it.
            let descendants = proc::descendants(&snapshot, root.pid, |p| {
                self.member(p.pid).is_some_and(|m| m.tree != tree)
            });
            let mut new = 0;
            for process in descendants {
                if self.member(process.pid).is_none() && self.seed(tree, process)? {
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

    /// Inserts one process found in /proc. Returns whether it is now a member counted in
    /// `seeded`. The insert races with the process's exit, which is settled here: the kernel
    /// removes only what is in the map when the thread group dies.
    fn seed(&mut self, tree: TreeId, process: &ProcessInfo) -> Result<bool> {
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
        let still_there = proc::process(process.pid)
            .is_some_and(|now| now.start_ticks == process.start_ticks && now.is_live());
        if still_there {
            // Alive after the insert: its exit, whenever it comes, is seen by the program.
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
}
