//! A member of a doomed tree that forks is killed by the kernel as it forks; the child it made
//! is still tracked (where the marks are in place, the fork is refused and no child is made). (Here the child runs its parent's code, a shell's `read`: one that
//! executes a program dies as it does, see doomed_newborn.rs.)

use std::{io::Write, os::unix::process::ExitStatusExt, process::Stdio};

use leash::kernel::Membership;
use leash_tests::{Cgroup, Scenario, tracked, tracker};

#[test]
fn a_doomed_member_that_forks_is_killed() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("doomed");
    // The child reads on from the same pipe, so it lives as long as the test holds it open.
    let script = "exec 3<&0; read line; (read more <&3) & wait";
    let mut command = cgroup.command("sh", &["-c", script]);
    command.stdin(Stdio::piped());
    let mut scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    tracker.doom(scenario.tree).unwrap();
    let mut stdin = scenario.root.stdin.take().unwrap();
    stdin.write_all(b"fork\n").unwrap();
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
    if tracker.membership() == Membership::Marks {
        assert!(
            truth.is_empty(),
            "the marks refuse the fork: no child is made"
        );
    } else {
        assert_eq!(truth.len(), 1, "the child made by the fatal fork runs");
    }
    drop(stdin);
}
