//! The leash programs. They keep `MEMBERS` true at every fork and exit:
//!
//! - fork (tp_btf `sched_process_fork`, before the child first runs): if the forking process
//!   is a member and the child is a new process (not a thread), the child joins its tree. If the
//!   tree is doomed, the forker is sent SIGKILL (the child, already made, is tracked and killed
//!   by user space, or as it execs).
//! - exit (tp_btf `sched_process_exit`): when a member's whole thread group is dead, it leaves;
//!   if it was the root, the tree's counters record when.
//! - exec (tp_btf `sched_process_exec`): an event saying what a member runs now; a member born
//!   into a doomed tree is sent SIGKILL before the new program runs.
//!
//! The fork and exit programs are attached twice, as two programs: the kernel skips a program
//! on a CPU where a preempted task is inside it, and a second one is seldom held at the same
//! time (see `leash_common::program::FORK_AGAIN`).
//!
//! All three are BTF-typed tracepoints: their links can be pinned on every kernel since 5.7,
//! they need no tracefs, and they read `task_struct` at offsets from the kernel's BTF.
//!
//! Events go to a ring buffer, best effort; the maps are the truth.
//!
//! Two more (hosts.rs) see a lease's host start to die, on `signal_generate` and
//! `signal_deliver`, so its trees' kill begins before the kernel has torn the host down.
//!
//! Beside them, a task iterator (`whois`) answers user space's questions about a client process
//! that only the kernel can: the owner of its user namespace, its pid namespaces. Another
//! (`descent`) finds processes by their ancestry: an adoption's descendants, and where there
//! are no marks, the children every fork program was skipped for.
//!
//! The ptrace guard (ptrace.rs) refuses a member attach-mode access to processes outside its
//! tree.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(
    target_arch = "bpf",
    expect(
        internal_features,
        reason = "core_intrinsics, for the counters' atomic adds"
    )
)]

#[cfg(target_arch = "bpf")]
mod descent;
#[cfg(target_arch = "bpf")]
mod hosts;
#[cfg(target_arch = "bpf")]
mod kill;
#[cfg(target_arch = "bpf")]
mod programs;
#[cfg(target_arch = "bpf")]
mod ptrace;
#[cfg(target_arch = "bpf")]
mod whois;

// The crate is built only for the BPF target; this keeps a host `cargo check --workspace` happy.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
