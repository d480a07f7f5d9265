//! What the daemon holds: the registry of leases and trees, who hears of which events, who
//! each client is beyond its uid, what every task shares, and the commands the rest of the
//! daemon sends the owner thread with what that thread holds.

pub(super) mod commands;
pub(super) mod identity;
pub(super) mod owner;
pub(super) mod registry;
pub(super) mod shared;
pub(super) mod subscribers;
