//! Bytes and descriptors in and out of the daemon's sockets, bounded. Accepting connections
//! (and each uid's places while they are set up); reading request lines with the descriptors
//! that come with them, which are emptied and closed where no close can block the daemon;
//! writing replies and events through each connection's outbox; the word to every connection
//! that the daemon stops; the listening socket itself.

pub(super) mod accept;
pub(super) mod admission;
pub(super) mod close_queue;
pub(super) mod disposal;
pub(super) mod emptying;
pub(super) mod outbox;
pub(super) mod request_stream;
pub(super) mod socket;
pub(super) mod stopping;
