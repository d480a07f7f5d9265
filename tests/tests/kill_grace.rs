//! The grace period: SIGTERM first; members that exit on it are gone before the grace ends,
//! and a member that ignores it is SIGKILLed after the grace.

use std::time::Duration;

use leash::kernel::{Kill, KillStep};
use leash_tests::{Scenario, comm, tracker, wait_for};

#[test]
fn members_that_exit_on_sigterm_need_no_sigkill() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = Scenario::spawn(
        &mut tracker,
        "grace-polite",
        "sh",
        &["-c", "sleep 600 & sleep 600 & wait"],
    );
    scenario.cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let grace = Duration::from_secs(5);
    let report = tracker.kill(scenario.tree, grace).unwrap();
    let _ = scenario.root.wait();
    assert_eq!(report.terminated, 3);
    assert_eq!(report.killed, 0, "{report:?}");
    assert!(
        report.elapsed < grace,
        "polite members should not wait out the grace: {report:?}"
    );
    assert!(scenario.cgroup.procs().is_empty());
}

#[test]
fn a_member_that_ignores_sigterm_is_killed_after_the_grace() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    // The ignored disposition survives exec: the second sleep ignores SIGTERM.
    let script = r#"sleep 600 & (trap "" TERM; exec sleep 600) & wait"#;
    let mut scenario = Scenario::spawn(&mut tracker, "grace-stubborn", "sh", &["-c", script]);
    scenario.cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let grace = Duration::from_millis(300);
    let report = tracker.kill(scenario.tree, grace).unwrap();
    let _ = scenario.root.wait();
    eprintln!("grace 300 ms with a SIGTERM-ignoring member: {report:?}");
    assert_eq!(report.terminated, 3);
    assert!(report.killed >= 1, "{report:?}");
    assert!(
        report.elapsed >= grace,
        "SIGKILL must wait for the grace: {report:?}"
    );
    assert!(tracker.member_pids(scenario.tree).unwrap().is_empty());
    assert!(scenario.cgroup.procs().is_empty());
}

/// A member that was there at the doom keeps its grace even if it executes a program in it
/// (here its SIGTERM handler execs a program that ignores SIGTERM): only a child born into the
/// doomed tree dies as it executes one (doomed_newborn.rs).
#[test]
fn a_member_that_execs_in_its_grace_keeps_it() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let script = r#"trap 'trap "" TERM; exec sleep 600' TERM; while :; do :; done"#;
    let scenario = Scenario::spawn(&mut tracker, "grace-exec", "sh", &["-c", script]);
    let member = *scenario.cgroup.settle_exactly(&["sh"]).first().unwrap();
    // Its handler must be in place before the SIGTERM comes.
    assert!(
        wait_for(Duration::from_secs(30), || catches(member, libc::SIGTERM)),
        "the shell never set its SIGTERM handler"
    );
    let grace = Duration::from_millis(500);
    // Stepped here, to see the member run its new program during the grace.
    let mut kill = Kill::new(scenario.tree, grace);
    let mut saw_exec = false;
    let mut report = None;
    let done = wait_for(Duration::from_secs(30), || {
        match kill.step(&mut tracker).expect("a kill step") {
            KillStep::Wait(_) => {}
            KillStep::Done(done) => report = Some(done),
        }
        saw_exec |= comm(member).as_deref() == Some("sleep");
        report.is_some()
    });
    assert!(done, "the kill did not end");
    let report = report.unwrap();
    eprintln!("grace 500 ms, the member execs in it: {report:?}");
    assert!(saw_exec, "the member's handler did not exec: {report:?}");
    assert_eq!(
        report.killed, 1,
        "it ran its new program until the grace ended: {report:?}"
    );
    assert!(report.elapsed >= grace, "{report:?}");
    assert!(scenario.cgroup.procs().is_empty());
}

/// Whether process `pid` has a handler for `signal` (SigCgt in /proc/PID/status).
fn catches(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}
