//! A fork chain: each process forks the next and then sleeps. Every hop is a member.

use leash_tests::{Scenario, assert_tracks_cgroup, chain_command, tracker};

#[test]
fn a_fork_chain_is_tracked_hop_by_hop() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let (cgroup, command) = chain_command("fork-chain", 40, None);
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    scenario.cgroup.settle(41, &["sleep"]);
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "fork chain, 40 hops",
    );
    assert_eq!(tracked, 41);
}
