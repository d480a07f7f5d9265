//! What the kernel layer could not do, by kind: the daemon gives each its code on the wire
//! (see `daemon::refusal`).

use leash_common::{Pid, TreeId};

/// Why a process could not be registered, or a tree changed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Identify(#[from] IdentifyError),
    #[error("process {0} exited")]
    Exited(Pid),
    #[error("process {0} is exiting")]
    Exiting(Pid),
    /// The member map has an entry for an earlier process by that pid: refused rather than
    /// guessed.
    #[error("pid {pid} is held by tree {tree} for a process that is gone")]
    StaleMember { pid: Pid, tree: TreeId },
    /// A kill has begun: no member may be put in behind it.
    #[error("tree {0} is being killed")]
    Doomed(TreeId),
    #[error("the member map is full ({0} processes on a leash, the daemon's capacity)")]
    MembersFull(u32),
    #[error("the tree limit ({0}) is reached; release a tree first")]
    TreesFull(u32),
    /// Passes over /proc kept finding new descendants.
    #[error("the tree of {0} kept growing faster than /proc could be read")]
    Runaway(Pid),
    #[error("tree {0} was finished before its descendants were all found")]
    Unfinished(TreeId),
    /// The maps could not be read or written.
    #[error(transparent)]
    Maps(#[from] anyhow::Error),
    #[error(transparent)]
    Map(#[from] aya::maps::MapError),
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
    #[error("cannot open process {pid}: {source}")]
    Io {
        pid: Pid,
        #[source]
        source: std::io::Error,
    },
    #[error("the descriptor sent is not a pidfd")]
    NotPidfd,
    #[error("the process of the pidfd sent has exited")]
    Gone,
    #[error("the process of the pidfd sent is in no pid namespace the daemon sees")]
    Invisible,
}
