//! Processes outside registered trees are never members, even while an untracked process forks
//! thousands of times next to a tracked tree.

use std::time::Duration;

use leash_tests::{Cgroup, Scenario, assert_tracks_cgroup, chain_command, tracker, wait_for};

#[test]
fn an_untracked_fork_storm_never_joins() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let (cgroup, command) = chain_command("tracked-beside-storm", 5, None);
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    scenario.cgroup.settle(6, &["sleep"]);
    let joins_before = tracker.stats().unwrap().joins;

    let storm_group = Cgroup::new("storm");
    let mut storm = storm_group
        .command("sh", &["-c", "for i in $(seq 3000); do /bin/true; done"])
        .spawn()
        .unwrap();
    let mut checks = 0;
    let finished = wait_for(Duration::from_secs(120), || {
        let counts = tracker.member_counts().unwrap();
        assert_eq!(
            counts.len(),
            1,
            "only the tracked tree may have members: {counts:?}"
        );
        assert_eq!(counts[&scenario.tree], 6, "the tracked tree must not grow");
        checks += 1;
        storm.try_wait().unwrap().is_some()
    });
    assert!(finished, "the storm did not finish");
    let stats = tracker.stats().unwrap();
    eprintln!(
        "untracked storm: 3000 forks, {checks} checks during it, joins {} -> {}",
        joins_before, stats.joins
    );
    assert_eq!(
        stats.joins, joins_before,
        "no fork outside the tree may join"
    );
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            scenario.tree,
            &scenario.cgroup,
            "tracked tree beside a 3000-fork storm"
        ),
        6
    );
}
