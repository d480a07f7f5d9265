//! Exec chains: sh -c -> bash -c -> python3. A process stays a member through exec; what it
//! runs now is what the listing shows.

use leash_tests::{Cgroup, Scenario, assert_tracks_cgroup, python, tracker};

#[test]
fn members_stay_members_through_exec() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    // `; true` keeps each shell alive as the parent of the next program.
    let script = r#"bash -c '"$PYTHON" -c "import time; time.sleep(600)"; true'; true"#;
    let cgroup = Cgroup::new("exec-chain");
    let mut command = cgroup.command("sh", &["-c", script]);
    command.env("PYTHON", python());
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    scenario.cgroup.settle_exactly(&["sh", "bash", "python"]);
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "exec chain sh -> bash -> python3",
    );
    assert_eq!(tracked, 3);
    let mut members = tracker.members(scenario.tree).unwrap();
    leash::kernel::fill_comms(&mut members);
    let mut comms: Vec<String> = members.into_iter().filter_map(|m| m.comm).collect();
    comms.sort();
    assert_eq!(comms.len(), 3);
    assert_eq!(comms[0], "bash");
    assert!(comms[1].starts_with("python"), "{comms:?}");
    assert_eq!(comms[2], "sh");
}
