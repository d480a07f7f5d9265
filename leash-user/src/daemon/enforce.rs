//! What runs on the owner thread, ahead of every request: the ring buffer's records, the kill
//! of a tree, when trees are killed (a root exits, a lease ends, the sweep), adoptions in short
//! steps, the take-over of a previous daemon's trees, and the thread itself.

pub(super) mod adoption;
pub(super) mod enforcement;
pub(super) mod owner_thread;
pub(super) mod recover;
pub(super) mod tree_events;
pub(super) mod triggers;
