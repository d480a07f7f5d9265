//! Marks, seen from user space: which membership guarantee is in place, and the marks' map and
//! reconciling iterator (leash-ebpf's marks.rs).
//!
//! Where the BPF LSM is active and the kernel has task storage, an LSM program on `task_alloc`
//! marks every child of a member before it can run, and the kernel never skips it: membership
//! is exact. Elsewhere it rests on the fork programs (tp_btf, attached twice), which a kernel
//! that runs them preemptibly (7.x) skips on a CPU where a preempted task is inside them:
//! layered, and a fork can go unseen.

use std::{
    io,
    os::fd::{AsFd, OwnedFd},
};

use aya::maps::{Map, MapData};
use leash_common::Mark;

use crate::sys::{self, Pidfd};

/// The membership guarantee in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Marks by the `task_alloc` LSM program, which the kernel never skips: no member's fork
    /// goes unseen.
    Marks,
    /// The fork programs alone: on a kernel that runs tracing programs preemptibly (7.x with
    /// CONFIG_PREEMPT_RCU), a fork can go unseen while a preempted task holds both.
    Layered,
}

impl Membership {
    /// Its name, for the log's fields, `leash status` and the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Marks => "marks",
            Self::Layered => "layered",
        }
    }

    /// What it promises, for the log and `leash status`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Marks => {
                "membership: exact. A BPF LSM program on task_alloc marks each member's child \
                 before it runs, and the kernel never skips it; a doomed tree forks nothing"
            }
            Self::Layered => {
                "membership: layered. The fork programs (a tracepoint program attached twice, \
                 and a kprobe where the kernel has kprobes) follow forks; a kernel that runs \
                 tracepoint programs preemptibly (Linux 7.x) can skip them, and a member's \
                 child goes unseen when all miss its fork. Exact membership needs the BPF LSM: add bpf \
                 to the kernel's lsm= boot parameter (leash doctor shows the line)"
            }
        }
    }
}

/// The marks' map, and the iterator that puts marked processes the member map lacks into it.
#[derive(Debug)]
pub(super) struct Marks {
    map: MapData,
    /// The reconciling iterator's link: each new iterator of it runs the program over every
    /// task.
    reconcile: OwnedFd,
}

impl Marks {
    pub(super) fn new(map: Map, reconcile: OwnedFd) -> anyhow::Result<Self> {
        let Map::Unsupported(map) = map else {
            anyhow::bail!("the marks' map is not a task storage map");
        };
        Ok(Self { map, reconcile })
    }

    /// The guarantee `marks` (those in place, if any) give.
    pub(super) fn membership(marks: Option<&Self>) -> Membership {
        if marks.is_some() {
            Membership::Marks
        } else {
            Membership::Layered
        }
    }

    /// The mark of the process `process` names, if it has one.
    pub(super) fn of(&self, process: &Pidfd) -> io::Result<Option<Mark>> {
        sys::task_storage_get(self.map.fd().as_fd(), process.as_fd())
    }

    /// Marks the process `process` names (its main thread: its other threads take their
    /// process's entry in the member map when they fork).
    pub(super) fn set(&self, process: &Pidfd, mark: Mark) -> io::Result<()> {
        sys::task_storage_set(self.map.fd().as_fd(), process.as_fd(), &mark)
    }

    /// Runs the reconciling iterator over every task: each marked process the member map lacks
    /// is put in, and counted as joined.
    pub(super) fn reconcile(&self) -> io::Result<()> {
        // A kill's step: it may draw on the reserve of descriptors.
        let mut iterator = sys::with_reserve(|| sys::bpf_iter_create(self.reconcile.as_fd()))?;
        io::copy(&mut iterator, &mut io::sink()).map(drop)
    }
}
