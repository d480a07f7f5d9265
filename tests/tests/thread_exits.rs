//! A thread's exit is not its process's. Two processes go on under their pid after their main
//! thread has exited, and both must stay in their tree, with all they fork afterwards, and die
//! with it: one whose main thread exits while another thread goes on and forks, and one that
//! calls exec from a thread other than its main one (the kernel ends the old main thread and the
//! process runs the new program under the same pid, as Go's `syscall.Exec` does). Kernels
//! before 6.16 tell the exit tracepoint only which thread ends.

use std::{collections::BTreeSet, fs, time::Duration};

use leash_tests::{Scenario, assert_tracks_cgroup, python, tracker, wait_for};

/// What every scenario's process starts last: three sleeps, one of them in a new session.
const FORKS: &str = "sleep 600 & setsid sleep 600 & exec sleep 600";

/// A thread other than the main one execs `sh -c FORKS`; the main thread waits meanwhile.
const EXEC_FROM_A_THREAD: &str = r#"
import os, sys, threading, time
threading.Thread(target=lambda: os.execv("/bin/sh", ["sh", "-c", sys.argv[1]])).start()
time.sleep(600)
"#;

/// The main thread exits; the other thread waits until it is gone, then starts `sh -c FORKS`
/// and stays.
const MAIN_THREAD_EXITS_FIRST: &str = r#"
import ctypes, os, subprocess, sys, time, threading
def main_thread_gone():
    with open(f"/proc/{os.getpid()}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
def work():
    while not main_thread_gone():
        time.sleep(0.01)
    subprocess.Popen(["sh", "-c", sys.argv[1]])
    while True:
        time.sleep(60)
threading.Thread(target=work).start()
ctypes.CDLL(None).pthread_exit(None)
"#;

#[test]
fn a_process_that_execs_from_a_thread_stays_in_its_tree() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = Scenario::spawn(
        &mut tracker,
        "exec-from-thread",
        &python(),
        &["-c", EXEC_FROM_A_THREAD, FORKS],
    );
    let root = scenario.root_pid();
    let processes = scenario.cgroup.settle_exactly(&["sleep", "sleep", "sleep"]);
    assert!(
        processes.contains(&root),
        "the process that exec'd from a thread goes on under its pid: {processes:?}"
    );
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            scenario.tree,
            &scenario.cgroup,
            "exec from a thread"
        ),
        processes.len()
    );
    kill_and_await_empty(&mut tracker, &mut scenario);
}

#[test]
fn a_process_whose_main_thread_exits_first_stays_in_its_tree() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut scenario = Scenario::spawn(
        &mut tracker,
        "main-thread-exits",
        &python(),
        &["-c", MAIN_THREAD_EXITS_FIRST, FORKS],
    );
    let root = scenario.root_pid();
    // Some kernels leave a process whose main thread has exited out of cgroup.procs;
    // cgroup.threads has its other thread, which names it.
    let mut processes = BTreeSet::new();
    let settled = wait_for(Duration::from_secs(60), || {
        processes = scenario.cgroup.processes();
        processes.len() == 4
            && processes
                .iter()
                .all(|&pid| pid == root || leash_tests::comm(pid).as_deref() == Some("sleep"))
    });
    assert!(
        settled,
        "expected the python process (its main thread gone) and three sleeps: {:?}",
        processes
            .iter()
            .map(|&p| (p, leash_tests::comm(p)))
            .collect::<Vec<_>>()
    );
    assert!(processes.contains(&root), "{processes:?}");
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            scenario.tree,
            &scenario.cgroup,
            "main thread exits first"
        ),
        processes.len()
    );
    kill_and_await_empty(&mut tracker, &mut scenario);
}

/// Kills the tree and waits for the cgroup to be empty of every thread: the tree, whole, died.
fn kill_and_await_empty(tracker: &mut leash::Tracker, scenario: &mut Scenario) {
    tracker
        .kill(scenario.tree, Duration::ZERO)
        .expect("killing the tree");
    assert!(
        wait_for(Duration::from_secs(10), || !scenario.cgroup.populated()),
        "the cgroup still has threads after the kill: {:?}",
        fs::read_to_string(
            scenario
                .cgroup
                .procs_file()
                .with_file_name("cgroup.threads")
        )
    );
}
