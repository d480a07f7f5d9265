//! A member of a doomed tree that forks is killed by the kernel as it forks; the child it made
//! is still tracked.

use std::{io::Write, os::unix::process::ExitStatusExt, process::Stdio};

use leash_tests::{Cgroup, Scenario, tracked, tracker};

#[test]
fn a_doomed_member_that_forks_is_killed() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("doomed");
    let mut command = cgroup.command("sh", &["-c", "read line; sleep 600 & wait"]);
    command.stdin(Stdio::piped());
    let mut scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    tracker.doom(scenario.tree).unwrap();
    scenario
        .root
        .stdin
        .take()
        .unwrap()
        .write_all(b"fork\n")
        .unwrap();
    let status = scenario.root.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(9),
        "the forking member must die of SIGKILL: {status:?}"
    );
    let left = tracked(&tracker, scenario.tree);
    let truth = scenario.cgroup.procs();
    assert_eq!(
        left, truth,
        "the child made by the fatal fork is still tracked"
    );
}
