//! Users cannot spend each other's capacity. The member map is one pool for every user; each
//! non-root uid may fill only its quota of it. Here uid 61001 runs a fork storm of 600 past a
//! pool of 512 and a quota of 64, while uid 61002's tree keeps forking beside it: 61001's tree
//! is killed (`member_quota`), every process of it, and 61002's tree never notices.

use std::{process::Child, time::Duration};

use leash_client::{EventKind, EventReason, protocol::KillReason};
use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B},
    wait_for,
};

#[test]
fn one_users_fork_storm_kills_only_its_own_tree() {
    let Some(daemon) = Daemon::start(&["--max-members", "512", "--max-members-per-uid", "64"])
    else {
        return;
    };
    let run_as = |uid: u32, cgroup: &Cgroup, script: &str| -> Child {
        let args = ["run", "--grace", "0", "--", "sh", "-c", script];
        daemon.leash_as(uid, cgroup, &args).spawn().unwrap()
    };
    let mut watcher = daemon.client();
    watcher.subscribe().unwrap();

    // 61002: a tree that forks all the time.
    let steady = Cgroup::new("quota-steady");
    let mut steady_host = run_as(USER_B, &steady, "while :; do sleep 0.05; done");
    steady.settle(3, &["leash", "sh", "sleep"]);

    // 61001: a storm past its quota, and past the whole pool.
    let storm = Cgroup::new("quota-storm");
    let mut storm_host = run_as(
        USER_A,
        &storm,
        "for i in $(seq 600); do sleep 600 & done; wait",
    );
    let mut reasons = Vec::new();
    while let Some(event) = watcher.next_event(Some(Duration::from_secs(20))).unwrap() {
        if event.kind == EventKind::KillStarted {
            reasons.push((event.tree, event.reason.clone()));
            break;
        }
    }
    let emptied = wait_for(Duration::from_secs(30), || storm.procs().is_empty());
    let trees = daemon.client().list().unwrap();
    eprintln!(
        "quota 64 of 512: kills {reasons:?}; storm emptied: {emptied}; trees now: {:?}; status: {:?}",
        trees
            .iter()
            .map(|t| (t.tree, t.owner_uid, t.members.len()))
            .collect::<Vec<_>>(),
        daemon.client().status().unwrap()
    );
    assert_eq!(
        reasons.first().and_then(|(_, reason)| reason.as_ref()),
        Some(&EventReason::Kill(KillReason::MemberQuota)),
        "the storm's tree is killed for its quota"
    );
    assert!(
        emptied,
        "left of the storm: {} processes",
        storm.procs().len()
    );
    let _ = storm_host.wait();
    // The programs said so in the daemon's log, as it happened.
    assert!(
        wait_for(Duration::from_secs(5), || daemon
            .log()
            .contains(r#"what="quota_hit""#)),
        "the programs' quota diagnostic in the daemon's log"
    );

    // The steady tree is whole, tracked and still forking.
    let steady_tree = trees
        .iter()
        .find(|t| t.owner_uid == USER_B)
        .expect("61002's tree is still registered");
    assert_eq!(steady_tree.state.as_str(), "live");
    assert!(
        steady_host.try_wait().unwrap().is_none(),
        "its host runs on"
    );
    let status = daemon.client().status().unwrap();
    assert_eq!(
        status.inserts_failed, 0,
        "no insert failed: the pool never filled"
    );
    let _ = steady_host.kill();
    let _ = steady_host.wait();
}
