//! A lease as the registry keeps it, and what it tells of leases.

use std::{io, sync::Arc};

use leash_client::protocol::LeaseId;
use leash_common::Account;

use crate::{proc::ProcessRef, sys};

/// A host's lease.
#[derive(Debug)]
pub(super) struct Lease {
    pub token: String,
    pub uid: u32,
    pub account: Account,
    /// The host's pid namespaces, its own first.
    pub pid_namespaces: Arc<[u32]>,
    /// The process that holds it.
    pub host: ProcessRef,
    /// A tree was registered under it: from then on its end is worth an INFO line.
    pub held_trees: bool,
}

/// A lease as `list` shows it (see `Registry::held_leases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::daemon) struct HeldLease {
    pub lease: LeaseId,
    pub uid: u32,
    pub host_pid: u32,
    /// Trees it holds now.
    pub trees: u64,
}

/// Leases counted: every connection, and hosts' (see `Registry::count_leases`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::daemon) struct LeaseCounts {
    pub all: usize,
    pub hosts: usize,
}

/// A lease's secret, which lets the `leash exec` shim join it: 128 random bits, in hex.
pub(super) fn new_token() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    sys::random_bytes(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
