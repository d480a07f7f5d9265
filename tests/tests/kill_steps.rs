//! A kill is a series of short steps whatever the tree's size: no step signals more than
//! `SIGNALS_PER_STEP` members, the rest waits in a queue that the following steps work through,
//! and the tree still ends empty. 2001 members that ignore SIGTERM: every one needs a SIGTERM
//! and a SIGKILL, several steps' worth of each. These kills signal through pidfds, as on
//! kernels before 6.13, even where the kernel kill would send the SIGKILLs in one pass.

use std::{
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use leash::{
    Tracker,
    kernel::{Kill, KillReport, KillStep, SIGNALS_PER_STEP},
};
use leash_common::TreeId;
use leash_tests::{Scenario, tracked, tracker, wait_for};

/// 20 shells that fan out 99 sleeps each, under a root that becomes a sleep: 2001 processes,
/// all ignoring SIGTERM (an ignored disposition survives fork and exec).
const FAN: &str = r#"trap "" TERM; for i in $(seq 20); do sh -c 'for j in $(seq 99); do sleep 600 & done; exec sleep 600' & done; exec sleep 600"#;
const MEMBERS: usize = 2001;

/// One fan at a time: three at once would take a fifth of the machine's pids.
static ONE_FAN: Mutex<()> = Mutex::new(());

fn fan(tracker: &mut Tracker, label: &str) -> Scenario {
    let scenario = Scenario::spawn(tracker, label, "sh", &["-c", FAN]);
    scenario.cgroup.settle(MEMBERS, &["sleep"]);
    // Every process of the fan is a member. A 7.x kernel may skip a fork or an exit program
    // for one of these thousands of processes (KERNEL-7X.md): a missed child is put in by the
    // reconciling pass that a kill also runs first, and a missed exit (of a `seq`, say) leaves
    // an entry the kill checks against /proc and does not signal. So the map may hold more
    // entries than the fan has processes, never fewer.
    tracker.reconcile_after_skips().unwrap();
    let truth = scenario.cgroup.processes();
    let untracked: Vec<_> = truth
        .difference(&tracked(tracker, scenario.tree))
        .copied()
        .collect();
    assert_eq!(truth.len(), MEMBERS);
    assert!(untracked.is_empty(), "not members: {untracked:?}");
    scenario
}

/// What one step did.
struct Stepped {
    signals: usize,
    step: KillStep,
}

fn step(kill: &mut Kill, tracker: &mut Tracker) -> Stepped {
    let before = sent(&kill.report());
    let step = kill.step(tracker).expect("kill step");
    let after = match &step {
        KillStep::Done(report) => sent(report),
        KillStep::Wait(_) => sent(&kill.report()),
    };
    Stepped {
        signals: after - before,
        step,
    }
}

fn sent(report: &KillReport) -> usize {
    report.terminated + report.killed
}

/// Drives `kill` to its end; returns its report and the signals each step sent. Prints the
/// longest step, for the record (time is not asserted: it depends on the machine).
fn drive(kill: &mut Kill, tracker: &mut Tracker) -> (KillReport, Vec<usize>) {
    let mut per_step = Vec::new();
    let mut longest = Duration::ZERO;
    loop {
        let started = Instant::now();
        let Stepped { signals, step } = step(kill, tracker);
        longest = longest.max(started.elapsed());
        per_step.push(signals);
        assert!(
            signals <= SIGNALS_PER_STEP,
            "a step sent {signals} signals, more than {SIGNALS_PER_STEP}"
        );
        match step {
            KillStep::Wait(pause) => thread::sleep(pause),
            KillStep::Done(report) => {
                eprintln!("longest step: {longest:?}");
                return (report, per_step);
            }
        }
    }
}

fn assert_gone(tracker: &Tracker, tree: TreeId, scenario: &mut Scenario) {
    let _ = scenario.root.wait();
    assert!(tracker.is_empty(tree).unwrap());
    assert!(
        wait_for(Duration::from_secs(10), || scenario
            .cgroup
            .procs()
            .is_empty()),
        "{} processes survived the kill",
        scenario.cgroup.procs().len()
    );
}

#[test]
fn each_step_signals_a_bounded_number_and_the_tree_ends_empty() {
    let _one = ONE_FAN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = fan(&mut tracker, "kill-steps");
    let tree = scenario.tree;
    let mut kill = Kill::new(tree, Duration::from_millis(500)).without_kernel_kill();
    let (report, per_step) = drive(&mut kill, &mut tracker);
    eprintln!(
        "{MEMBERS} members: {report:?} in {} steps, at most {} signals a step",
        per_step.len(),
        per_step.iter().max().unwrap()
    );
    assert_eq!(report.terminated, MEMBERS, "every member got SIGTERM");
    assert_eq!(
        report.killed, MEMBERS,
        "every member ignored it and got SIGKILL"
    );
    let full_steps = per_step.iter().filter(|&&n| n == SIGNALS_PER_STEP).count();
    assert!(
        full_steps >= 2 * (MEMBERS / SIGNALS_PER_STEP),
        "the SIGTERMs and the SIGKILLs each took several full steps: {per_step:?}"
    );
    assert_gone(&tracker, tree, &mut scenario);
    tracker.release(tree).unwrap();
}

#[test]
fn a_step_with_signals_still_queued_asks_to_be_called_again_at_once() {
    let _one = ONE_FAN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = fan(&mut tracker, "kill-steps-zero");
    let tree = scenario.tree;
    let mut kill = Kill::new(tree, Duration::ZERO).without_kernel_kill();
    let first = step(&mut kill, &mut tracker);
    assert_eq!(first.signals, SIGNALS_PER_STEP);
    assert!(
        matches!(first.step, KillStep::Wait(pause) if pause.is_zero()),
        "{:?}",
        first.step
    );
    assert!(
        !tracker.is_empty(tree).unwrap(),
        "members not signalled yet are still there"
    );
    let (report, _) = drive(&mut kill, &mut tracker);
    assert_eq!(report.terminated, 0);
    assert_eq!(report.killed, MEMBERS);
    assert_gone(&tracker, tree, &mut scenario);
    tracker.release(tree).unwrap();
}

#[test]
fn a_grace_shortened_while_sigterms_are_queued_ends_at_once() {
    let _one = ONE_FAN.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = fan(&mut tracker, "kill-steps-shortened");
    let tree = scenario.tree;
    let mut kill = Kill::new(tree, Duration::from_secs(600)).without_kernel_kill();
    let first = step(&mut kill, &mut tracker);
    assert_eq!(first.signals, SIGNALS_PER_STEP);
    assert_eq!(kill.report().terminated, SIGNALS_PER_STEP);
    kill.shorten_grace(Duration::ZERO);
    let (report, _) = drive(&mut kill, &mut tracker);
    eprintln!("grace shortened after the first step: {report:?}");
    assert_eq!(
        report.terminated, SIGNALS_PER_STEP,
        "no SIGTERM goes out once the grace is over"
    );
    assert_eq!(report.killed, MEMBERS);
    assert!(
        report.elapsed < Duration::from_secs(60),
        "the 600 s grace was not cut short: {report:?}"
    );
    assert_gone(&tracker, tree, &mut scenario);
    tracker.release(tree).unwrap();
}
