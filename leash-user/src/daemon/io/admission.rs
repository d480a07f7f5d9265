//! Admission: a connection is charged to the uid it connected as (SO_PEERCRED, read at accept
//! with no I/O) before it costs the daemon more than its socket, and holds a place until it is
//! identified. Its host's pidfds are opened only then (see `connection::set_up`).
//!
//! Setting a connection up reads /proc and may wait its turn to be asked about in the kernel;
//! a connect-and-close loop (from a user namespace: `unshare -Ur` connects as its owner's uid)
//! outran it, and the accepted sockets waiting to be set up held every descriptor the daemon
//! had: another user's host could not connect, nor a kill open its members. Now:
//! - a uid has at most as many connections being set up as it may hold open (`--max-
//!   connections-per-uid`); one more is refused at accept, before a task is spawned for it;
//! - all uids together have at most [`OVERALL`]; past that the daemon stops accepting until a
//!   place frees, and what waits stays in the kernel's listen queue, costing it nothing.
//!
//! Root is not counted per uid (it is the one who can stop the daemon), only in all.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::accept::RateLimit;

/// Connections being set up at most, every uid's.
pub(in crate::daemon) const OVERALL: usize = 512;

/// The places, one daemon's.
#[derive(Debug)]
pub(in crate::daemon) struct Admission {
    room: Arc<Semaphore>,
    /// Places per uid.
    of_uid: usize,
    per_uid: Arc<Mutex<HashMap<u32, usize>>>,
    refusals: Mutex<RateLimit>,
}

/// Room for one more connection in all: taken before accepting.
#[derive(Debug)]
pub(in crate::daemon) struct Room {
    _permit: OwnedSemaphorePermit,
}

/// A connection's place while it is set up, given up when dropped.
#[derive(Debug)]
pub(in crate::daemon) struct Place {
    _room: Room,
    uid: u32,
    per_uid: Arc<Mutex<HashMap<u32, usize>>>,
}

impl Admission {
    /// Places for `of_uid` connections of each uid being set up.
    pub(in crate::daemon) fn new(of_uid: usize) -> Self {
        Self {
            room: Arc::new(Semaphore::new(OVERALL)),
            of_uid,
            per_uid: Arc::default(),
            refusals: Mutex::default(),
        }
    }

    /// One more refusal: the count to log now, if a line is due.
    pub(in crate::daemon) fn log_refusal(&self) -> Option<u64> {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals.failed(Instant::now())
    }

    /// Waits for room for one more connection.
    pub(in crate::daemon) async fn room(&self) -> Room {
        Room {
            _permit: self
                .room
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed"),
        }
    }

    /// The place of a connection of `uid` in `room`, or why it is refused.
    pub(in crate::daemon) fn place(&self, room: Room, uid: u32) -> Result<Place, String> {
        if uid != 0 {
            let mut per_uid = self.per_uid.lock().unwrap_or_else(|e| e.into_inner());
            let of_uid = per_uid.entry(uid).or_default();
            if *of_uid >= self.of_uid {
                return Err(format!(
                    "uid {uid} has {of_uid} connections being set up, the most allowed; try \
                     again once they are"
                ));
            }
            *of_uid += 1;
        }
        Ok(Place {
            _room: room,
            uid,
            per_uid: self.per_uid.clone(),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.uid == 0 {
            return;
        }
        let mut per_uid = self.per_uid.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = per_uid.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                per_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_uid_has_a_few_places_and_all_a_bounded_number() {
        let admission = Admission::new(32);
        let mut alices = Vec::new();
        for _ in 0..32 {
            alices.push(admission.place(admission.room().await, 1001).unwrap());
        }
        let refused = admission.place(admission.room().await, 1001).unwrap_err();
        assert!(refused.contains("uid 1001 has 32 connections"), "{refused}");
        let bobs = admission.place(admission.room().await, 1002).unwrap();
        drop(alices);
        assert!(
            admission.place(admission.room().await, 1001).is_ok(),
            "given back"
        );
        drop(bobs);
        assert!(
            admission.per_uid.lock().unwrap().is_empty(),
            "nothing left behind"
        );

        let mut roots = Vec::new();
        for _ in 0..OVERALL {
            roots.push(admission.place(admission.room().await, 0).unwrap());
        }
        let full = tokio::time::timeout(std::time::Duration::from_millis(50), admission.room());
        assert!(full.await.is_err(), "no room past OVERALL: accepting waits");
        roots.pop();
        let _room = admission.room().await;
    }
}
