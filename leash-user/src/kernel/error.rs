//! What the kernel layer could not do, by kind: the daemon gives each its code on the wire
//! (see `daemon::rules::refusal`).

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
    /// The tree to change is not in the maps.
    #[error("no tree {0}")]
    NoTree(TreeId),
    /// Every tree id has been given out.
    #[error("tree ids ran out")]
    TreeIdsRanOut,
    /// A release could not hand the members of `tree` back to the tree it is nested in: they
    /// forked faster than they were moved.
    #[error("the members of tree {tree} kept forking while they were handed back to {enclosing}")]
    HandBackRunaway { tree: TreeId, enclosing: TreeId },
    /// The marks' reconciling iterator failed. Its cause is part of the message, not a source,
    /// so the text reads the same whether the causes are written out or not.
    #[error("running the reconciling iterator: {0}")]
    Reconcile(std::io::Error),
    /// A member's entry could not be taken out of the map.
    #[error(transparent)]
    TakeMember(std::io::Error),
    /// The maps could not be read (the views' reads and the descent iterator's passes say
    /// what they read in their own words).
    #[error(transparent)]
    Maps(#[from] anyhow::Error),
    /// A map operation failed.
    #[error(transparent)]
    Map(#[from] aya::maps::MapError),
}

impl Error {
    /// This error and each of its causes, joined by ": " as anyhow's `{:#}` writes them: the
    /// text the daemon logs, and replies with where an internal failure is told in full.
    pub fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(error) = cause {
            text.push_str(": ");
            text.push_str(&error.to_string());
            cause = error.source();
        }
        text
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_causes_reads_as_anyhow_writes_a_chain() {
        let read = || {
            anyhow::Error::new(std::io::Error::other("out of memory"))
                .context("reading the member map")
        };
        assert_eq!(Error::Maps(read()).with_causes(), format!("{:#}", read()));
        assert_eq!(
            Error::Maps(read()).with_causes(),
            "reading the member map: out of memory"
        );
        assert_eq!(Error::NoTree(3).with_causes(), "no tree 3");
    }
}
