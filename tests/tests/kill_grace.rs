//! The grace period: SIGTERM first; members that exit on it are gone before the grace ends,
//! and a member that ignores it is SIGKILLed after the grace.

use std::time::Duration;

use leash_tests::{Scenario, tracker};

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
