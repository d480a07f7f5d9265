//! What the daemon is told and the rules it keeps, all of them decisions that need no kernel
//! and no state: its configuration, who a client is (its peer credentials and how it numbers
//! pids), who may do what to which tree, the per-account caps, why a lease ends, and the error
//! reply a request is refused with.

pub(super) mod auth;
pub(super) mod config;
pub(super) mod lease_end;
pub(super) mod limits;
pub(super) mod peer;
pub(super) mod pid_numbering;
pub(super) mod refusal;
