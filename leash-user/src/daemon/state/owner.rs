//! What the owner thread holds: the tracker, which only enforcement and the commands of
//! `commands` touch, one bounded step at a time (see `owner_thread`).

use std::{
    cell::{Cell, RefCell, RefMut},
    sync::Arc,
};

use super::shared::Daemon;
use crate::kernel::Tracker;

/// What the owner thread holds; enforcement runs on it.
pub(in crate::daemon) struct Owner {
    pub daemon: Arc<Daemon>,
    tracker: RefCell<Tracker>,
    /// The kernel's count of ring-buffer records it had no room for, when last read.
    pub events_dropped: Cell<u64>,
}

impl Owner {
    pub(in crate::daemon) fn new(daemon: Arc<Daemon>, tracker: Tracker) -> Self {
        let events_dropped = tracker.stats().map_or(0, |stats| stats.events_dropped);
        Self {
            daemon,
            tracker: RefCell::new(tracker),
            events_dropped: Cell::new(events_dropped),
        }
    }

    /// The tracker, for one step. Never held across an await: the owner's tasks take turns.
    pub(in crate::daemon) fn tracker(&self) -> RefMut<'_, Tracker> {
        self.tracker.borrow_mut()
    }
}
