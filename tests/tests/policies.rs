//! Per-tree policies and requests: keep on root exit, release, kill with a grace period, and
//! the events a subscriber sees.

use std::time::Duration;

use leash_client::{EventKind, RootExitPolicy, TreeOptions};
use leash_tests::{
    Cgroup,
    daemon::{Daemon, LeashedTree},
    wait_for,
};

#[test]
fn keep_on_root_exit_leaves_the_tree_until_its_lease_ends() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let cgroup = Cgroup::new("keep");
    let keep = TreeOptions {
        on_root_exit: RootExitPolicy::Keep,
        grace: None,
    };
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "setsid sleep 600 & exit 0"]),
            &keep,
        )
        .unwrap();
    root.wait().unwrap();
    cgroup.settle(1, &["sleep"]);
    let listed = host.list().unwrap();
    let info = listed
        .iter()
        .find(|t| t.tree == tree)
        .expect("the tree is still there");
    assert!(leash_tests::wait_for(Duration::from_secs(5), || {
        host.list()
            .unwrap()
            .iter()
            .any(|t| t.tree == tree && t.root_exited)
    }));
    assert_eq!(
        info.members.len(),
        1,
        "the orphan is kept, and still a member"
    );
    assert_eq!(cgroup.procs().len(), 1);
    drop(host);
    assert!(
        cgroup.wait_empty(Duration::from_secs(10)).is_some(),
        "kept members die with the lease"
    );
}

#[test]
fn a_released_tree_is_left_alone() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let mut released = LeashedTree::spawn(
        &mut host,
        "release",
        "sleep",
        &["600"],
        &TreeOptions::default(),
    );
    host.release(released.tree).unwrap();
    assert!(host.list().unwrap().is_empty());
    drop(host);
    // Once the daemon has ended the host's lease (only this client's is left), a kill of the
    // lease's trees would have started; give it the time it takes to land.
    let mut observer = daemon.client();
    assert!(wait_for(Duration::from_secs(10), || {
        observer.status().is_ok_and(|s| s.leases == 1)
    }));
    let killed = wait_for(Duration::from_millis(500), || {
        released.root.try_wait().unwrap().is_some()
    });
    assert!(!killed, "a released tree must not be killed with its lease");
}

#[test]
fn kill_waits_for_an_empty_tree_and_subscribers_see_it_happen() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let mut watcher = daemon.client();
    watcher.subscribe().unwrap();
    let cgroup = Cgroup::new("kill-events");
    let script = r#"sleep 600 & (trap "" TERM; exec sleep 600) & wait"#;
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", script]),
            &TreeOptions::default(),
        )
        .unwrap();
    cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let summary = host.kill(tree, Some(Duration::from_millis(200))).unwrap();
    let _ = root.wait();
    eprintln!("kill with grace 200 ms: {summary:?}");
    assert_eq!(summary.terminated, 3);
    assert!(
        summary.killed >= 1,
        "the TERM-ignoring member needs SIGKILL"
    );
    assert!(summary.elapsed_ms >= 200);
    assert!(
        cgroup.procs().is_empty(),
        "the reply comes when the tree is empty"
    );

    let mut kinds = Vec::new();
    while let Some(event) = watcher.next_event(Some(Duration::from_secs(5))).unwrap() {
        assert_eq!(event.tree, tree);
        kinds.push(event.kind);
        if event.kind == EventKind::TreeEmpty {
            assert_eq!(event.kill.as_ref().map(|k| k.killed), Some(summary.killed));
            break;
        }
    }
    // The members' lives: two forks, and three exits during the kill.
    let count = |kind| kinds.iter().filter(|&&k| k == kind).count();
    assert_eq!(
        (count(EventKind::Fork), count(EventKind::Exit)),
        (2, 3),
        "{kinds:?}"
    );
    // The tree's life; the root's death during the kill is reported too, as it happens.
    kinds.retain(|k| {
        !matches!(
            k,
            EventKind::RootExited | EventKind::Fork | EventKind::Exec | EventKind::Exit
        )
    });
    assert_eq!(
        kinds,
        [
            EventKind::Registered,
            EventKind::KillStarted,
            EventKind::TreeEmpty
        ]
    );
}
