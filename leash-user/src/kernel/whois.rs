//! What the kernel knows of a client process that the daemon may not read in /proc: who owns
//! the user namespace it runs in, and which pid namespaces it is in (/proc/PID/ns/* needs the
//! right to trace the process, which the daemon does not have). The whois program, a task
//! iterator, answers: write the pid into its map, read an iterator to its end, read the answer.
//! One question at a time; a question costs one pass over the machine's tasks, so the daemon
//! asks only about clients in a user or pid namespace of their own.

use std::{
    io::Read,
    os::fd::{AsFd, OwnedFd},
    sync::Mutex,
};

use anyhow::{Context, Result};
use aya::maps::{Array, Map, MapData};
use leash_common::{Pid, Whois as Record};

use crate::sys;

/// A process, as the kernel knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The outermost user namespace below the initial one that it runs in: its owner (a uid
    /// of the initial namespace) and inode number. None: it runs in the initial one.
    pub user_ns: Option<UserNamespace>,
    /// The inode numbers of its pid namespaces, its own first, then each one above it, the
    /// initial one last.
    pub pid_namespaces: Box<[u32]>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserNamespace {
    pub creator_uid: u32,
    pub inum: u32,
}

/// Asks the whois program. Shared by every thread.
pub struct Whois {
    /// The iterator's link: each question makes a new iterator of it.
    link: OwnedFd,
    map: Mutex<Array<MapData, Record>>,
}

impl std::fmt::Debug for Whois {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Whois").finish_non_exhaustive()
    }
}

impl Whois {
    /// `link` is a descriptor of the whois program's iterator link, `map` its map.
    pub fn new(link: OwnedFd, map: Map) -> Result<Self> {
        Ok(Self {
            link,
            map: Mutex::new(Array::try_from(map)?),
        })
    }

    /// What the kernel knows of process `pid` (a thread group id of the daemon's pid
    /// namespace). None: there is no such process (any more).
    pub fn ask(&self, pid: Pid) -> Result<Option<Identity>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.set(0, Record::asking(pid), 0)
            .context("asking the whois program")?;
        let mut iterator =
            sys::bpf_iter_create(self.link.as_fd()).context("starting the whois iterator")?;
        // The program writes nothing to the iterator itself: reading it runs the program.
        let mut sink = Vec::new();
        iterator
            .read_to_end(&mut sink)
            .context("running the whois iterator")?;
        let answer = map.get(&0, 0).context("reading the whois answer")?;
        Ok((answer.found != 0 && answer.pid == pid).then(|| Identity::from(&answer)))
    }
}

impl From<&Record> for Identity {
    fn from(answer: &Record) -> Self {
        let levels = (answer.pid_ns_levels as usize).min(answer.pid_ns.len());
        Self {
            user_ns: (answer.user_ns_inum != 0).then_some(UserNamespace {
                creator_uid: answer.user_ns_owner,
                inum: answer.user_ns_inum,
            }),
            pid_namespaces: answer.pid_ns[..levels].iter().rev().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_lists_pid_namespaces_innermost_first() {
        let mut answer = Record::asking(42);
        answer.found = 1;
        answer.pid_ns_levels = 2;
        answer.pid_ns[0] = 4026531836;
        answer.pid_ns[1] = 4026532400;
        answer.user_ns_owner = 1000;
        answer.user_ns_inum = 4026532399;
        let identity = Identity::from(&answer);
        assert_eq!(&*identity.pid_namespaces, &[4026532400, 4026531836]);
        assert_eq!(
            identity.user_ns,
            Some(UserNamespace {
                creator_uid: 1000,
                inum: 4026532399
            })
        );
        assert_eq!(Identity::from(&Record::asking(1)).user_ns, None);
    }
}
