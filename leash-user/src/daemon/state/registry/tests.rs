use super::*;

fn entry(lease: LeaseId, account: Account) -> TreeEntry {
    let holder = Holder {
        owner_uid: 1000,
        account,
        ..Holder::default()
    };
    TreeEntry::new(
        lease,
        &holder,
        account,
        [1].into(),
        [42].into(),
        RootExitPolicy::Kill,
        Duration::from_secs(1),
    )
}

fn lease(registry: &Registry) -> LeaseId {
    registry
        .open_lease(
            1000,
            1000,
            [1].into(),
            ProcessRef {
                pid: 10,
                start_ticks: 100,
            },
        )
        .unwrap()
}

#[test]
fn tokens_are_random_hex() {
    let (a, b) = (new_token().unwrap(), new_token().unwrap());
    assert_eq!(a.len(), 32);
    assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
}

#[test]
fn registrations_under_way_count_against_the_quota() {
    let registry = Registry::default();
    let first = registry.reserve(&[1000], 2).unwrap();
    let second = registry.reserve(&[1000], 2).unwrap();
    // Two registrations side by side take both places before either is filed.
    assert_eq!(
        registry.reserve(&[1000], 2).err(),
        Some(OverQuota {
            account: 1000,
            held: 2
        })
    );
    drop(second);
    let third = registry.reserve(&[1000], 2).unwrap();
    let lease = lease(&registry);
    assert_eq!(registry.file(7, entry(lease, 1000), None, first), None);
    // Filed, it counts as a tree and no longer as a reservation.
    assert!(registry.reserve(&[1000], 2).is_err());
    drop(third);
    assert!(registry.reserve(&[1000], 2).is_ok());
}

#[test]
fn a_tree_counts_against_both_accounts_and_root_has_no_quota() {
    let registry = Registry::default();
    let _both = registry.reserve(&[1000, 2000, 0], 1).unwrap();
    assert!(registry.reserve(&[2000], 1).is_err());
    assert!(registry.reserve(&[1000], 1).is_err());
    assert!(registry.reserve(&[0], 1).is_ok());
}

#[test]
fn a_tree_filed_after_its_lease_ended_is_to_be_killed() {
    let registry = Registry::default();
    let lease = lease(&registry);
    assert!(
        registry
            .end_lease(lease, LeaseEnd::ConnectionClosed)
            .is_empty()
    );
    let place = registry.reserve(&[1000], 10).unwrap();
    assert_eq!(
        registry.file(3, entry(lease, 1000), None, place),
        Some(KillReason::LeaseEnded)
    );
}

#[test]
fn a_tree_filed_inside_a_dying_tree_is_to_be_killed() {
    let registry = Registry::default();
    let lease = lease(&registry);
    let place = registry.reserve(&[], 10).unwrap();
    assert_eq!(registry.file(1, entry(lease, 1000), None, place), None);
    assert!(matches!(
        registry.begin_kill(1, None),
        Some(KillStart::Begun(_))
    ));
    let place = registry.reserve(&[], 10).unwrap();
    assert_eq!(
        registry.file(2, entry(lease, 1000), Some(1), place),
        Some(KillReason::EnclosingKilled)
    );
    let place = registry.reserve(&[], 10).unwrap();
    assert_eq!(
        registry.file(4, entry(lease, 1000), Some(99), place),
        Some(KillReason::EnclosingKilled)
    );
}

#[test]
fn a_kill_is_begun_once_and_its_grace_only_shortens() {
    let registry = Registry::default();
    let lease = lease(&registry);
    let place = registry.reserve(&[], 10).unwrap();
    let _ = registry.file(1, entry(lease, 1000), None, place);
    let Some(KillStart::Begun(begun)) = registry.begin_kill(1, Some(Duration::from_secs(5))) else {
        panic!("the first kill begins");
    };
    // The tree's own grace (1 s) is shorter than the 5 s asked.
    assert_eq!(begun.grace, Duration::from_secs(1));
    let Some(KillStart::UnderWay(_)) = registry.begin_kill(1, Some(Duration::from_millis(10)))
    else {
        panic!("a second kill waits on the first");
    };
    assert_eq!(*begun.grace_asked.borrow(), Duration::from_millis(10));
    let _ = registry.begin_kill(1, Some(Duration::from_secs(3)));
    assert_eq!(*begun.grace_asked.borrow(), Duration::from_millis(10));
    assert_eq!(
        registry.take_for_release(1).err(),
        Some(Some(TreeState::Killing))
    );
    assert!(registry.live_trees().is_empty());
    assert!(registry.kill_failed(1).is_some());
    assert_eq!(
        registry.take_for_release(1).err(),
        Some(Some(TreeState::Unkillable))
    );
    assert_eq!(registry.take_for_release(2).err(), Some(None));
}

#[test]
fn a_lease_ends_once_with_its_trees() {
    let registry = Registry::default();
    let lease = lease(&registry);
    let place = registry.reserve(&[], 10).unwrap();
    let _ = registry.file(5, entry(lease, 1000), None, place);
    assert_eq!(registry.end_lease(lease, LeaseEnd::HostExited), vec![5]);
    assert!(
        registry
            .end_lease(lease, LeaseEnd::ConnectionClosed)
            .is_empty()
    );
    assert_eq!(registry.lease_for(lease, None).err(), Some(NoLease::Own));
}

#[test]
fn a_token_names_its_lease() {
    let registry = Registry::default();
    let (own, other) = (lease(&registry), lease(&registry));
    let token = registry.token(other).unwrap();
    assert_eq!(
        registry.lease_for(own, Some(&token)).ok().unwrap().lease,
        other
    );
    assert_eq!(registry.lease_for(own, None).ok().unwrap().lease, own);
    assert_eq!(
        registry.lease_for(own, Some("0000")).err(),
        Some(NoLease::Token)
    );
}

#[test]
fn a_root_exit_is_recorded_once() {
    let registry = Registry::default();
    let lease = lease(&registry);
    let place = registry.reserve(&[], 10).unwrap();
    let _ = registry.file(6, entry(lease, 1000), None, place);
    assert!(registry.root_exited(6).is_some());
    assert!(registry.root_exited(6).is_none());
    assert!(registry.root_exited(8).is_none());
}

#[test]
fn a_host_is_named_by_its_pid_and_start_and_holds_trees_while_a_lease_of_it_does() {
    let registry = Registry::default();
    let host = ProcessRef {
        pid: 10,
        start_ticks: 100,
    };
    let (first, second) = (lease(&registry), lease(&registry));
    // The same pid, started later: another process.
    let later = registry
        .open_lease(
            1000,
            1000,
            [1].into(),
            ProcessRef {
                pid: 10,
                start_ticks: 200,
            },
        )
        .unwrap();
    let mut leases = registry.leases_of(host);
    leases.sort_unstable();
    assert_eq!(leases, vec![first, second]);
    assert_eq!(registry.host_of(later).map(|h| h.start_ticks), Some(200));
    assert!(!registry.host_holds_trees(host), "no tree yet");
    let place = registry.reserve(&[], 10).unwrap();
    let _ = registry.file(5, entry(second, 1000), None, place);
    assert!(registry.host_holds_trees(host));
    let _ = registry.end_lease(first, LeaseEnd::ConnectionClosed);
    assert!(
        registry.host_holds_trees(host),
        "the second lease holds tree 5"
    );
    let _ = registry.end_lease(second, LeaseEnd::HostKilled);
    assert!(!registry.host_holds_trees(host));
    assert_eq!(registry.leases_of(host), Vec::<LeaseId>::new());
}

#[test]
fn hosts_leases_are_those_that_registered_a_tree() {
    let registry = Registry::default();
    let (host, viewer) = (lease(&registry), lease(&registry));
    let _other_uid = registry
        .open_lease(
            2000,
            2000,
            [1].into(),
            ProcessRef {
                pid: 11,
                start_ticks: 100,
            },
        )
        .unwrap();
    registry.lease_holds_a_tree(host);
    let everyone = registry.count_leases(|_, _| true);
    assert_eq!(everyone, LeaseCounts { all: 3, hosts: 1 });
    let uid_1000 = registry.count_leases(|uid, _| uid == 1000);
    assert_eq!(uid_1000, LeaseCounts { all: 2, hosts: 1 });
    registry.end_lease(viewer, LeaseEnd::ConnectionClosed);
    registry.end_lease(host, LeaseEnd::ConnectionClosed);
    assert_eq!(
        registry.count_leases(|_, _| true),
        LeaseCounts { all: 1, hosts: 0 }
    );
}
