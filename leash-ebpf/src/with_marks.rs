//! The leash programs with marks (marks.rs): the object user space loads where the kernel has
//! task storage (Linux 5.11), the same as leash-ebpf's own (main.rs) and a map and two programs
//! more. A kernel without task storage refuses the whole object, for its one map.
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
mod marks;
#[cfg(target_arch = "bpf")]
mod programs;
#[cfg(target_arch = "bpf")]
mod ptrace;
#[cfg(target_arch = "bpf")]
mod whois;

#[cfg(not(target_arch = "bpf"))]
fn main() {}
