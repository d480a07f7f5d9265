//! Who hears of which tree events. Subscribers are filed by what they may hear (a uid's trees,
//! one lease's trees, everything), so an event is matched and encoded once, and reaches only
//! the outboxes it is for: a subscriber costs nothing for another user's events.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use leash_client::protocol::{Event, LeaseId, ServerLine};

use crate::daemon::{
    io::outbox::{Outbox, encode},
    rules::pid_numbering::PidNumbering,
};

/// What one subscriber may hear.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(in crate::daemon) enum Hears {
    /// Root: every tree.
    Everything,
    /// The trees owned by this uid.
    Uid(u32),
    /// A process inside a tree: only its own lease's trees.
    Lease(LeaseId),
}

/// Who may hear of a tree's events: its owner's uid (for [`Hears::Uid`]), and the pid
/// namespaces it was registered from (a subscriber in none of them hears nothing of it).
#[derive(Clone, Debug)]
pub(in crate::daemon) struct Audience {
    pub owner_uid: u32,
    pub registered_from: Arc<[u32]>,
}

/// One subscriber: its lease, where its events go, how it numbers processes, and its pid
/// namespace.
struct Subscriber {
    lease: LeaseId,
    outbox: Outbox,
    numbering: PidNumbering,
    pid_namespace: u32,
}

type Filed = HashMap<Hears, Vec<Subscriber>>;

#[derive(Default)]
pub(in crate::daemon) struct Subscribers(Mutex<Filed>);

impl Subscribers {
    fn filed(&self) -> MutexGuard<'_, Filed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Files the connection of `lease`, a client in pid namespace `pid_namespace`; it hears
    /// until [`Subscribers::remove`]. Its events carry pids as `numbering` gives them.
    pub(in crate::daemon) fn add(
        &self,
        hears: Hears,
        lease: LeaseId,
        outbox: Outbox,
        numbering: PidNumbering,
        pid_namespace: u32,
    ) {
        let subscriber = Subscriber {
            lease,
            outbox,
            numbering,
            pid_namespace,
        };
        self.filed().entry(hears).or_default().push(subscriber);
    }

    pub(in crate::daemon) fn remove(&self, lease: LeaseId) {
        self.filed().retain(|_, subscribers| {
            subscribers.retain(|subscriber| subscriber.lease != lease);
            !subscribers.is_empty()
        });
    }

    /// Whether anyone would hear of an event of `owner_uid`'s tree held by `lease`.
    pub(in crate::daemon) fn any_for(&self, owner_uid: u32, lease: LeaseId) -> bool {
        let filed = self.filed();
        [
            Hears::Everything,
            Hears::Uid(owner_uid),
            Hears::Lease(lease),
        ]
        .iter()
        .any(|hears| filed.contains_key(hears))
    }

    /// Sends `event`, of a tree heard of by `audience`, to those who may hear it: encoded once
    /// for all of them, but for subscribers in containers, whose writers number its pids their
    /// way. An event about a tree's root comes with the root's numbers (`root_numbers`), picked
    /// here.
    pub(in crate::daemon) fn deliver(
        &self,
        audience: &Audience,
        event: Event,
        root_numbers: Option<&[u32]>,
    ) {
        let lease = event.lease;
        let mut filed = self.filed();
        let mut line: Option<Arc<[u8]>> = None;
        for hears in [
            Hears::Everything,
            Hears::Uid(audience.owner_uid),
            Hears::Lease(lease),
        ] {
            let Some(subscribers) = filed.get_mut(&hears) else {
                continue;
            };
            let line = line.get_or_insert_with(|| encode(&ServerLine::event(event.clone())).into());
            // A closed outbox is a subscriber that left: forget it.
            subscribers.retain(|subscriber| match root_numbers {
                _ if !audience.registered_from.contains(&subscriber.pid_namespace) => true,
                _ if subscriber.numbering.is_daemons() => subscriber.outbox.event(line),
                Some(numbers) => {
                    let mut numbered = event.clone();
                    numbered.pid = Some(subscriber.numbering.pick(numbers));
                    subscriber
                        .outbox
                        .event(&encode(&ServerLine::event(numbered)).into())
                }
                None => subscriber
                    .outbox
                    .event_to_number(&event, subscriber.numbering, line.len()),
            });
        }
        filed.retain(|_, subscribers| !subscribers.is_empty());
    }

    /// Tells every subscriber that `count` events were lost before the daemon read them (the
    /// kernel's ring buffer was full): nobody can say whose they were.
    pub(in crate::daemon) fn dropped_everywhere(&self, count: u64) {
        let mut filed = self.filed();
        for subscribers in filed.values_mut() {
            subscribers.retain(|subscriber| subscriber.outbox.dropped(count));
        }
        filed.retain(|_, subscribers| !subscribers.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leash_client::protocol::EventKind;

    const HOST_NS: u32 = 4026531836;
    const CONTAINER_NS: u32 = 4026532500;

    /// A tree of `owner_uid`'s registered from the daemon's namespace.
    fn from_host(owner_uid: u32) -> Audience {
        Audience {
            owner_uid,
            registered_from: [HOST_NS].into(),
        }
    }

    fn queued(outbox: &Outbox) -> bool {
        !outbox.written().is_empty()
    }

    #[test]
    fn events_reach_only_who_may_hear_them() {
        let subscribers = Subscribers::default();
        let (root, own, other, confined, elsewhere) = Default::default();
        subscribers.add(
            Hears::Everything,
            1,
            Outbox::clone(&root),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.add(
            Hears::Uid(1000),
            2,
            Outbox::clone(&own),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.add(
            Hears::Uid(1001),
            3,
            Outbox::clone(&other),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.add(
            Hears::Lease(7),
            4,
            Outbox::clone(&confined),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.add(
            Hears::Lease(8),
            5,
            Outbox::clone(&elsewhere),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.deliver(
            &from_host(1000),
            Event::new(EventKind::Fork, 1, 7, Some(42)),
            None,
        );
        assert!(queued(&root) && queued(&own) && queued(&confined));
        assert!(!queued(&other) && !queued(&elsewhere));
    }

    #[test]
    fn a_container_hears_only_of_trees_registered_from_it_or_below() {
        let from_container = Audience {
            owner_uid: 1000,
            registered_from: [CONTAINER_NS, HOST_NS].into(),
        };
        for (audience, heard_in_container) in [(from_host(1000), false), (from_container, true)] {
            let subscribers = Subscribers::default();
            let (host, container, sibling) = Default::default();
            let nested = PidNumbering::nested(1);
            subscribers.add(
                Hears::Uid(1000),
                1,
                Outbox::clone(&host),
                PidNumbering::default(),
                HOST_NS,
            );
            subscribers.add(
                Hears::Uid(1000),
                2,
                Outbox::clone(&container),
                nested,
                CONTAINER_NS,
            );
            subscribers.add(
                Hears::Uid(1000),
                3,
                Outbox::clone(&sibling),
                nested,
                CONTAINER_NS + 1,
            );
            let event = Event::new(EventKind::Fork, 1, 7, Some(42));
            subscribers.deliver(&audience, event, None);
            assert!(queued(&host), "the host's namespace hears of every tree");
            assert_eq!(queued(&container), heard_in_container, "{audience:?}");
            assert!(
                !queued(&sibling),
                "another container, same uid: {audience:?}"
            );
        }
    }

    #[test]
    fn a_subscriber_that_left_is_forgotten() {
        let subscribers = Subscribers::default();
        let gone = Outbox::default();
        subscribers.add(
            Hears::Uid(1000),
            2,
            gone.clone(),
            PidNumbering::default(),
            HOST_NS,
        );
        gone.close();
        subscribers.deliver(
            &from_host(1000),
            Event::new(EventKind::Fork, 1, 7, Some(42)),
            None,
        );
        assert!(!subscribers.any_for(1000, 7));
        subscribers.add(
            Hears::Uid(1000),
            3,
            Outbox::default(),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.remove(3);
        assert!(!subscribers.any_for(1000, 7));
    }

    #[test]
    fn a_subscriber_in_a_container_is_sent_its_own_numbers() {
        let subscribers = Subscribers::default();
        let (host, container) = (Outbox::default(), Outbox::default());
        subscribers.add(
            Hears::Uid(1000),
            1,
            host.clone(),
            PidNumbering::default(),
            HOST_NS,
        );
        subscribers.add(
            Hears::Uid(1000),
            2,
            container.clone(),
            PidNumbering::nested(1),
            CONTAINER_NS,
        );
        // This process runs in the daemon's namespace: a container nested in it cannot see it.
        let me = std::process::id();
        let from_container = Audience {
            owner_uid: 1000,
            registered_from: [CONTAINER_NS, HOST_NS].into(),
        };
        subscribers.deliver(
            &from_container,
            Event::new(EventKind::Exec, 1, 7, Some(me)),
            None,
        );
        let pid_in = |outbox: &Outbox| {
            let written = outbox.written();
            let line: serde_json::Value = serde_json::from_slice(&written).unwrap();
            line["event"]["pid"].as_u64()
        };
        assert_eq!(pid_in(&host), Some(u64::from(me)));
        assert_eq!(pid_in(&container), Some(0));
    }
}
