//! The compiled programs, embedded, and handles into them.

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};
use aya::{Ebpf, programs::links::FdLink};
use leash_common::program;

use crate::sys;

/// The compiled programs, embedded at build time by build.rs.
static PROGRAMS: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leash-ebpf"));

/// The same programs with the marks' map and programs (leash-ebpf's marks.rs), for kernels
/// with task storage (Linux 5.11): a kernel without refuses the whole object for its one map.
static PROGRAMS_WITH_MARKS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/leash-ebpf-marks"));

/// The object to load: with the marks where `marks` says the kernel can have them.
pub(super) fn object_for(marks: bool) -> &'static [u8] {
    if marks { PROGRAMS_WITH_MARKS } else { PROGRAMS }
}

/// The object `ebpf` was loaded from (the one with the marks has their map).
pub(super) fn object(ebpf: &Ebpf) -> &'static [u8] {
    object_for(ebpf.map(leash_common::map::MARKS).is_some())
}

/// The programs `Tracker::load` attaches, and where: each to a BTF-typed tracepoint (tp_btf).
/// The fork and exit programs twice (see [`program::FORK_AGAIN`]), in this order.
pub const PROGRAMS_ATTACHED: [(&str, &str); 7] = [
    (program::FORK, "tp_btf/sched_process_fork"),
    (program::FORK_AGAIN, "tp_btf/sched_process_fork"),
    (program::EXIT, "tp_btf/sched_process_exit"),
    (program::EXIT_AGAIN, "tp_btf/sched_process_exit"),
    (program::EXEC, "tp_btf/sched_process_exec"),
    (program::HOST_KILL, "tp_btf/signal_generate"),
    (program::HOST_CRASH, "tp_btf/signal_deliver"),
];

/// A descriptor of `link` of its own (aya's handles lend none), which holds the link whatever
/// becomes of the handle.
pub(super) fn link_fd(link: &FdLink) -> Result<OwnedFd> {
    let id = link.info()?.id();
    sys::bpf_link_fd_by_id(id).context("opening a BPF link by its id")
}

pub(super) fn program_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} missing from the object"))
}

pub(super) fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("map {name} missing from the object"))
}
