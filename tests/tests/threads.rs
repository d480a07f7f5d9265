//! A process with many threads is one member; a fork from one of its threads is a member; the
//! process stays a member while its threads come and go.

use std::{io::Write, process::Stdio, time::Duration};

use leash_tests::{
    Cgroup, Scenario, assert_tracks_cgroup, python, thread_count, tracker, wait_for,
};

const THREADS: &str = r#"
import subprocess, sys, threading
go = threading.Event()
def work(i):
    if i == 7:
        subprocess.Popen(["sleep", "600"])
    go.wait()
threads = [threading.Thread(target=work, args=(i,)) for i in range(50)]
for t in threads: t.start()
sys.stdin.readline()
go.set()
for t in threads: t.join()
import time; time.sleep(600)
"#;

#[test]
fn fifty_threads_are_one_member() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("threads");
    let mut command = cgroup.command(&python(), &["-c", THREADS]);
    command.stdin(Stdio::piped());
    let mut scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
    let python = scenario.root_pid();
    scenario.cgroup.settle_exactly(&["python", "sleep"]);
    assert!(
        wait_for(Duration::from_secs(30), || thread_count(python) >= 51),
        "threads did not start"
    );
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "50 threads + a fork from a thread",
    );
    assert_eq!(
        tracked, 2,
        "50 threads are one member, and the thread's child is the other"
    );

    // Let the threads end: the process is still a member, and still one.
    scenario
        .root
        .stdin
        .take()
        .unwrap()
        .write_all(b"\n")
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || thread_count(python) == 1),
        "threads did not end"
    );
    assert!(
        tracker.member(python).is_some(),
        "threads ending must not end membership"
    );
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            scenario.tree,
            &scenario.cgroup,
            "after 50 threads exited"
        ),
        2
    );
}
