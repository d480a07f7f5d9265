//! The disposal's bounds, its lanes and its overflow, on socket pairs and pipes.

use super::*;
use crate::sys::SCM_MAX_FD;
use std::time::{Duration, Instant};

fn fds(count: usize) -> Vec<OwnedFd> {
    (0..count)
        .map(|_| OwnedFd::from(std::io::pipe().unwrap().0))
        .collect()
}

fn counted(disposal: &Disposal) -> usize {
    disposal.state().counted
}

fn settled(disposal: &Disposal) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        {
            let state = disposal.state();
            if state.counted == 0 && state.accounts.is_empty() && state.threads == 0 {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn an_account_gets_no_more_room_than_its_share() {
    let disposal = Disposal::default();
    let held = disposal.reserve(1000, PER_ACCOUNT).unwrap();
    assert!(disposal.reserve(1000, 1).is_none(), "over its own share");
    assert!(
        disposal.reserve(1000, 0).is_some(),
        "nothing to dispose of needs no room"
    );
    drop(disposal.reserve(5000, 0));
    assert!(
        !disposal.state().accounts.contains_key(&5000),
        "and leaves nothing behind"
    );
    assert!(
        disposal.reserve(1001, 1).is_some(),
        "another account has room"
    );
    drop(held);
    assert!(disposal.reserve(1000, 1).is_some(), "room given back");
    assert!(settled(&disposal));
}

#[test]
fn all_accounts_together_get_no_more_than_the_overall_bound() {
    let disposal = Disposal::default();
    let held: Vec<Reservation> = (0..OVERALL / PER_ACCOUNT)
        .map(|account| disposal.reserve(account as Account, PER_ACCOUNT).unwrap())
        .collect();
    assert!(disposal.reserve(99_999, 1).is_none());
    drop(held);
    assert!(settled(&disposal));
}

#[test]
fn what_is_disposed_of_is_closed_and_its_room_given_back() {
    let disposal = Disposal::default();
    for account in 0..(THREADS as Account * 3) {
        let reservation = disposal.reserve(account, 10).unwrap();
        reservation.dispose(fds(4));
    }
    assert!(settled(&disposal), "{} still counted", counted(&disposal));
}

#[test]
fn a_connection_slot_is_dropped_once_its_socket_is_closed() {
    let disposal = Disposal::default();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let (pipe, _) = std::io::pipe().unwrap();
    leash_client::sys::send_with_fd(&theirs, b"queued\n", pipe.as_fd()).unwrap();
    let (dropped, was_dropped) = std::sync::mpsc::channel::<()>();
    struct Slot(std::sync::mpsc::Sender<()>);
    impl Drop for Slot {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    disposal.close_connection(7, ours.into(), Some(Box::new(Slot(dropped))));
    assert!(was_dropped.recv_timeout(Duration::from_secs(10)).is_ok());
    assert!(settled(&disposal));
}

#[test]
fn past_a_few_parked_connections_an_account_overflows_to_the_close_queue() {
    use std::{io::Read, os::unix::net::UnixStream};
    let disposal = Disposal::default();
    // A connection carrying a descriptor: the socket, and the other end of the socket pair
    // whose one end it carries (it reads end of file once that is closed).
    let carrying = || {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (watched, queued) = UnixStream::pair().unwrap();
        sys::send_fds(theirs.as_fd(), &[queued.as_fd()]).unwrap();
        watched
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (OwnedFd::from(ours), watched)
    };
    // The first one's slot holds its lane's thread until it is let go: a stuck close.
    struct Stuck(std::sync::mpsc::Receiver<()>);
    impl Drop for Stuck {
        fn drop(&mut self) {
            let _ = self.0.recv_timeout(Duration::from_secs(30));
        }
    }
    let (release, stuck) = std::sync::mpsc::channel();
    let (socket, mut first) = carrying();
    disposal.close_connection(7, socket, Some(Box::new(Stuck(stuck))));
    let mut parked = Vec::new();
    for _ in 1..PARKED_PER_ACCOUNT {
        let (socket, watched) = carrying();
        disposal.close_connection(7, socket, None);
        parked.push(watched);
    }
    assert!(disposal.parked_full(7));
    assert!(
        !disposal.parked_full(8),
        "another account's lane is its own"
    );
    for _ in 0..(SCM_MAX_FD + 3) {
        let (socket, mut watched) = carrying();
        disposal.close_connection(7, socket, None);
        assert!(
            matches!(watched.read(&mut [0; 1]), Ok(0)),
            "closed through the close queue, behind no stuck close"
        );
    }
    assert_eq!(
        disposal.state().accounts[&7].counted,
        PARKED_PER_ACCOUNT,
        "only the parked ones are the lane's"
    );
    release.send(()).unwrap();
    assert!(matches!(first.read(&mut [0; 1]), Ok(0)));
    for mut watched in parked {
        assert!(matches!(watched.read(&mut [0; 1]), Ok(0)));
    }
    assert!(settled(&disposal));
    assert!(!disposal.parked_full(7));
}

#[test]
fn all_accounts_together_park_no_more_than_the_overall_bound() {
    use std::os::unix::net::UnixStream;
    let disposal = Disposal::default();
    {
        // As if as many connections waited in lanes already, each account under its own.
        let mut state = disposal.state();
        state.parked = PARKED_OVERALL;
    }
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (mut watched, queued) = UnixStream::pair().unwrap();
    sys::send_fds(theirs.as_fd(), &[queued.as_fd()]).unwrap();
    drop(queued);
    disposal.close_connection(1234, ours.into(), None);
    assert!(
        !disposal.state().accounts.contains_key(&1234),
        "to the close queue, not a lane"
    );
    watched
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(matches!(
        std::io::Read::read(&mut watched, &mut [0; 1]),
        Ok(0)
    ));
    disposal.state().parked = 0;
    assert!(settled(&disposal));
}

#[test]
fn a_connection_with_nothing_queued_is_closed_in_place() {
    let disposal = Disposal::default();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    std::io::Write::write_all(&mut &theirs, b"no descriptors\n").unwrap();
    let slot: Box<dyn Send> = Box::new(());
    disposal.close_connection(7, ours.into(), Some(slot));
    assert_eq!(disposal.state().threads, 0, "no thread was needed");
    assert!(settled(&disposal));
}
