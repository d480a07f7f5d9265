//! The doomed make nothing new. A member whose SIGTERM handler forks (as an agent running its
//! users' end-of-session hooks does) dies in the kernel as it forks; the child it made was born
//! into a doomed tree and is SIGKILLed at once, not given the grace period meant for existing
//! members' own cleanup. Here the child would act one second after its birth; the grace is 30 s.
//! And a child born after the doom cannot start a program, not even in its first
//! microseconds, before user space has seen it: it dies in the kernel as it execs.
//!
//! Where the marks are in place (`leash status`: membership marks) no child is born at all: the
//! `task_alloc` program refuses a doomed tree's fork and kills the forker.

use std::{fs, time::Duration};

use leash::{
    Tracker,
    kernel::{Kill, KillStep, Membership},
};
use leash_tests::{Cgroup, Removed, Scenario, python, tracker, wait_for};

/// The root: on SIGTERM, start a child (a new program, which acts after a second), then go on.
/// Beside it, a member that ignores SIGTERM keeps the kill in its grace period.
const MEMBER: &str = r#"
trap '(exec "$PYTHON" -c "import sys, time; time.sleep(1); open(sys.argv[1], \"w\").write(\"acted\")" "$MARKER") & ' TERM
(trap '' TERM; exec sleep 600) &
while :; do sleep 600 & wait $!; done
"#;

#[test]
fn a_child_born_after_the_doom_is_killed_before_it_acts() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let marker = Removed(
        std::env::temp_dir().join(format!("leash-test-{}-newborn-acted", std::process::id())),
    );
    let cgroup = Cgroup::new("doomed-newborn");
    let mut command = cgroup.command("sh", &["-c", MEMBER]);
    // The shell says `Terminated` of its sleep that the kill ends.
    command
        .env("PYTHON", python())
        .env("MARKER", &marker.0)
        .stderr(cgroup.output_log());
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    scenario.cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let tree = scenario.tree;
    let joined_before = tracker.tree_status(tree).unwrap().joined;
    let marks = tracker.membership() == Membership::Marks;

    // A kill with a long grace, stepped here (as the daemon steps it) while the cgroup is read.
    let mut kill = Kill::new(tree, Duration::from_secs(30));
    let started = std::time::Instant::now();
    let mut saw_newborn = false;
    // Step it here until the newborn has come and gone, watching the cgroup.
    let newborn_gone = step_within_grace(&mut tracker, &mut kill, |tracker| {
        let status = tracker.tree_status(tree).unwrap();
        saw_newborn |= status.joined > joined_before;
        // Left: the member that ignores SIGTERM, and nothing else.
        (saw_newborn || marks) && scenario.cgroup.procs().len() == 1
    });
    eprintln!(
        "newborn seen: {saw_newborn}, gone after {:?}, still in the cgroup: {:?}",
        started.elapsed(),
        scenario.cgroup.procs()
    );
    if marks {
        assert!(
            !saw_newborn,
            "the marks refuse a doomed tree's fork: no child is born"
        );
    } else {
        assert!(saw_newborn, "the SIGTERM handler forked no child");
    }
    assert!(
        newborn_gone,
        "the child born after the doom lived on into the grace period"
    );
    assert!(
        !fs::exists(&marker.0).unwrap(),
        "the child born after the doom acted"
    );
}

/// The root: on SIGTERM, write (in the shell itself: the grace period is for this), then fork a
/// subshell that at once execs a program that writes. It waits on a child that ignores SIGTERM
/// (and keeps the kill in its grace period), so it forks nothing before its handler runs.
const QUICK_CHILD: &str = r#"
trap 'echo handler >> "$LOG"; ( exec /bin/echo child >> "$LOG" ); echo forked >> "$LOG"' TERM
(trap '' TERM; exec sleep 600) &
while :; do wait $!; done
"#;
#[test]
fn a_child_born_after_the_doom_cannot_exec() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let log = Removed(
        std::env::temp_dir().join(format!("leash-test-{}-newborn-log", std::process::id())),
    );
    let cgroup = Cgroup::new("doomed-exec");
    let mut command = cgroup.command("sh", &["-c", QUICK_CHILD]);
    command.env("LOG", &log.0);
    let scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    scenario.cgroup.settle_exactly(&["sh", "sleep"]);
    let tree = scenario.tree;

    let mut kill = Kill::new(tree, Duration::from_secs(30));
    // Until the root has run its handler and died forking, its child is gone, and only the
    // member that ignores SIGTERM is left.
    let settled = step_within_grace(&mut tracker, &mut kill, |_| {
        let written = fs::read_to_string(&log.0).unwrap_or_default();
        written.contains("handler") && scenario.cgroup.procs().len() == 1
    });
    let written = fs::read_to_string(&log.0).unwrap_or_default();
    assert!(
        settled,
        "the handler did not run, or the tree did not shrink: {written:?}"
    );
    assert_eq!(
        written, "handler\n",
        "the root died as it forked, and its child as it executed a program"
    );
}

/// Steps `kill` (as the daemon steps it) until `condition` holds, for 10 s at most; the kill
/// must still be in its grace period all the while.
fn step_within_grace(
    tracker: &mut Tracker,
    kill: &mut Kill,
    mut condition: impl FnMut(&Tracker) -> bool,
) -> bool {
    wait_for(Duration::from_secs(10), || {
        match kill.step(tracker).expect("a kill step") {
            KillStep::Wait(_) => {}
            KillStep::Done(report) => panic!("the kill ended early: {report:?}"),
        }
        condition(tracker)
    })
}
