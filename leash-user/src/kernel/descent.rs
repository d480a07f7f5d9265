//! Descent, seen from user space: the iterator that finds processes by their ancestry in the
//! kernel (leash-ebpf's descent.rs). An adoption's pass is one reading of it: every process
//! below the root that no tree holds (or that the enclosing tree holds) is put into the tree
//! being adopted, in the kernel, counted there, with no /proc read. Where there are no marks,
//! a reading also reconciles: a process no tree holds whose nearest tracked ancestor is a
//! member joins that member's tree.
//!
//! What a reading asks is its thread's entry in `DESCENTS`, so readings on several threads
//! (adoptions on blocking threads, a kill's reconciling on the tracker's owner) never wait
//! for each other.

use std::{
    io::Read,
    os::fd::{AsFd, OwnedFd},
    sync::Mutex,
};

use anyhow::{Context, Result, bail};
use aya::maps::{HashMap, Map, MapData};
use leash_common::{Descended, Descent as Request, TreeId};

use crate::sys;

/// The descent iterator and its requests, and the kernel kill, which takes its requests the
/// same way. Shared by every thread.
pub struct Descent {
    /// The iterator's link: each reading makes a new iterator of it.
    link: OwnedFd,
    /// The kernel kill's link, where the kernel has its kfunc (leash-ebpf's kill.rs).
    kill: Option<OwnedFd>,
    requests: Mutex<HashMap<MapData, u32, Request>>,
}

impl std::fmt::Debug for Descent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Descent").finish_non_exhaustive()
    }
}

/// What one reading did.
#[derive(Debug, Default)]
pub struct Reading {
    /// The processes it put in, as the program wrote them (a few may be missing: see
    /// [`Reading::added`]).
    pub found: Vec<Descended>,
    /// How many processes no tree held it put in: the program's own count, which the records
    /// may fall short of (one whose record did not fit a read() is put in but not written).
    pub added: u32,
    /// How many members of the enclosing tree it moved down (an adoption's).
    pub moved: u32,
    /// Why it stopped early, if it did.
    pub stopped: Option<Stopped>,
}

/// Why a reading stopped before the end of the task list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The member map is at its capacity.
    Full,
    /// The tree being adopted is doomed.
    Doomed,
}

impl Descent {
    /// `link` is a descriptor of the descent program's iterator link, `kill` the kernel
    /// kill's, `map` their `DESCENTS`.
    pub fn new(link: OwnedFd, kill: Option<OwnedFd>, map: Map) -> Result<Self> {
        Ok(Self {
            link,
            kill,
            requests: Mutex::new(HashMap::try_from(map)?),
        })
    }

    /// Whether the kernel kill is in place.
    pub fn kills(&self) -> bool {
        self.kill.is_some()
    }

    /// Sends `signal` to every member of `tree` from the kernel, in one pass over the
    /// machine's tasks: how many it signalled. None where the kernel kill is not in place.
    pub fn kill(&self, tree: TreeId, signal: i32) -> Result<Option<u32>> {
        let Some(kill) = &self.kill else {
            return Ok(None);
        };
        let signal = u32::try_from(signal).context("a negative signal")?;
        let reading = self
            .read_from(kill, Request::killing(tree, signal), For::Enforcement)
            .context("running the kernel kill")?;
        Ok(Some(reading.added))
    }

    /// One pass of the adoption of `tree`, nested in `enclosing`: every process whose nearest
    /// tracked ancestor is a member of `tree` (walking through members of `enclosing`), and
    /// which is not one yet, is put in. Blocks for as long as the kernel walks every task (a
    /// few tens of ms for 100k): call it off the tracker's owner.
    pub fn adopt(&self, tree: TreeId, enclosing: Option<TreeId>) -> Result<Reading> {
        self.read_from(&self.link, Request::adopting(tree, enclosing), For::Client)
            .context("running the descent iterator for an adoption")
    }

    /// Puts every process no tree holds, whose nearest tracked ancestor is a member, into that
    /// member's tree, reported as forks on the ring buffer.
    pub fn reconcile(&self) -> Result<Reading> {
        self.read_from(&self.link, Request::reconciling(), For::Enforcement)
            .context("running the descent iterator to reconcile")
    }

    /// One reading of the iterator of `link`, for `request`, made `by`.
    fn read_from(&self, link: &OwnedFd, request: Request, by: For) -> Result<Reading> {
        // The kernel's thread id of this thread (the daemon runs in the initial pid
        // namespace; if not, the program finds no entry, which `seen` tells).
        // SAFETY: gettid takes nothing and cannot fail.
        let reader = unsafe { libc::gettid() } as u32;
        self.requests()
            .insert(reader, request, 0)
            .context("asking the descent program")?;
        let create = || sys::bpf_iter_create(link.as_fd());
        let iterator = match by {
            For::Enforcement => sys::with_reserve(create),
            For::Client => create(),
        };
        let read = iterator.and_then(|mut iterator| {
            let mut bytes = Vec::new();
            iterator.read_to_end(&mut bytes).map(|_| bytes)
        });
        let mut requests = self.requests();
        let answer = requests.get(&reader, 0);
        let _ = requests.remove(&reader);
        drop(requests);
        let bytes = read.context("reading the descent iterator")?;
        let answer = answer.context("reading the descent program's answer")?;
        if answer.seen == 0 {
            bail!(
                "the descent program never saw this thread's request: is the daemon in a pid \
                 namespace of its own?"
            );
        }
        let stopped = match answer.stopped {
            0 => None,
            Request::FULL => Some(Stopped::Full),
            _ => Some(Stopped::Doomed),
        };
        Ok(Reading {
            found: records(&bytes),
            added: answer.added,
            moved: answer.moved,
            stopped,
        })
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, HashMap<MapData, u32, Request>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Who a reading is for: a kill's, which may draw on the reserve of descriptors kept for
/// enforcement (see `sys::with_reserve`), or a client's adoption, which may not.
#[derive(Clone, Copy)]
enum For {
    Enforcement,
    Client,
}

/// The records the program wrote, each a [`Descended`] in the machine's byte order.
fn records(bytes: &[u8]) -> Vec<Descended> {
    let word = |record: &[u8], i: usize| {
        let mut word = [0; 4];
        word.copy_from_slice(&record[i * 4..i * 4 + 4]);
        u32::from_ne_bytes(word)
    };
    bytes
        .chunks_exact(size_of::<Descended>())
        .map(|record| Descended {
            pid: word(record, 0),
            tree: word(record, 1),
            from: word(record, 2),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_in_the_programs_layout() {
        let mut bytes = Vec::new();
        for word in [100u32, 3, 0, 101, 3, 2] {
            bytes.extend_from_slice(&word.to_ne_bytes());
        }
        // A torn tail (never written by the program) is not a record.
        bytes.push(7);
        let found = records(&bytes);
        assert_eq!(
            found,
            [
                Descended {
                    pid: 100,
                    tree: 3,
                    from: 0
                },
                Descended {
                    pid: 101,
                    tree: 3,
                    from: 2
                },
            ]
        );
    }
}
