//! leash: keeps process trees on a leash. The kernel programs follow every descendant of a
//! registered root as it forks; this crate loads them and reads what they know.
//!
//! - [`daemon`]: the `leash daemon` service: leases over a Unix socket, enforcement.
//! - [`kernel`]: load and attach the programs, register trees, read members and counters.
//! - [`proc`]: what /proc says about processes.
//! - [`sys`]: the thin unsafe wrappers over system calls.
//! - `trusted_dir`: the check that the daemon's socket and pin directories are root's alone.

pub mod daemon;
pub mod kernel;
pub mod proc;
pub mod sys;
pub mod trusted_dir;

pub use kernel::{Capacity, KillReport, MemberInfo, Stats, Tracker, TreeEvent, TreeStatus};
