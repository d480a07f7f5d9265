//! A fork chain that calls setsid at every hop: each process is alone in its own session and
//! process group, which defeats killpg and session-based cleanup. Not leash.

use leash_tests::{Scenario, assert_tracks_cgroup, chain_command, tracker};

#[test]
fn setsid_at_every_hop_does_not_escape() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let (cgroup, command) = chain_command("setsid-chain", 40, Some("setsid"));
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    let procs = scenario.cgroup.settle(41, &["sleep"]);
    // The scenario really did what it says: every hop leads a session of its own.
    let sessions: std::collections::BTreeSet<i32> = procs
        .iter()
        .filter_map(|&pid| procfs::process::Process::new(pid as i32).ok()?.stat().ok())
        .map(|stat| stat.session)
        .collect();
    assert_eq!(sessions.len(), 41, "every hop should have its own session");
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "setsid chain, 40 hops",
    );
    assert_eq!(tracked, 41);
}
