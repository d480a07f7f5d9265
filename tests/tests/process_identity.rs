//! A process is its pid and its start time, and registration names a process, not a thread or
//! a pid that is about to be someone else's.
//!
//! - A thread id is refused, with an error naming its process (its entry would never be
//!   removed: the exit program looks members up by process).
//! - A process whose main thread has exited while another runs is alive, and is registered.
//! - Adopting a busy tree, whose children exit as they are found, leaves no entry for a process
//!   that is gone: every kill of such a tree empties it (an entry left behind would never
//!   leave, and the kill would give up after 30 s, after SIGKILLing whatever got the pid).

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    time::Duration,
};

use leash_client::{Error, ErrorCode, TreeOptions};
use leash_tests::{Cgroup, Scenario, daemon::Daemon, python, tracker, wait_for};

/// Prints its pid, then the id of a second thread, then lets its main thread exit (the
/// process lives on in the second thread) when told to on stdin.
const THREADED: &str = r#"
import ctypes, os, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ready = threading.Event()
def worker():
    print(libc.syscall(186), flush=True)  # gettid
    ready.set()
    while True:
        time.sleep(60)
threading.Thread(target=worker).start()
ready.wait()
print(os.getpid(), flush=True)
if sys.stdin.readline().strip() == "exit-main":
    libc.pthread_exit(None)
time.sleep(600)
"#;

/// Starts [`THREADED`] in `cgroup`; returns it, its pid and its second thread's id.
fn threaded(cgroup: &Cgroup) -> (std::process::Child, u32, u32) {
    let mut child = cgroup
        .command(&python(), &["-c", THREADED])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> u32 { lines.next().unwrap().unwrap().trim().parse().unwrap() };
    let tid = next();
    let pid = next();
    (child, pid, tid)
}

#[test]
fn a_thread_id_is_refused_and_names_its_process() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("thread-id");
    let (mut process, pid, tid) = threaded(&cgroup);
    assert_ne!(pid, tid);
    let mut host = daemon.client();
    let refused = host.adopt(tid, &TreeOptions::default());
    let _ = process.kill();
    let _ = process.wait();
    match refused {
        Err(Error::Daemon { code, message }) => {
            assert_eq!(code, ErrorCode::BadRequest, "{message}");
            assert!(
                message.contains(&format!("thread of process {pid}")),
                "the error names the process: {message}"
            );
        }
        other => panic!("registering thread {tid} of {pid} was not refused: {other:?}"),
    }
    assert!(host.list().unwrap().is_empty(), "nothing was registered");
}

#[test]
fn a_process_whose_main_thread_exited_is_registered_and_killed() {
    use std::io::Write;
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("leader-exited");
    let (mut process, pid, _) = threaded(&cgroup);
    process
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"exit-main\n")
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || {
            leash::proc::process(pid).is_some_and(|p| p.state == 'Z')
        }),
        "the main thread did not exit"
    );
    let mut host = daemon.client();
    let tree = host
        .adopt(pid, &TreeOptions::default())
        .expect("a process with a running thread is alive, and may be registered");
    let summary = host.kill(tree, Some(Duration::ZERO)).expect("the kill");
    let populated =
        std::fs::read_to_string(cgroup.procs_file().with_file_name("cgroup.events")).unwrap();
    let _ = process.wait();
    assert!(
        populated.contains("populated 0"),
        "killed, and every thread gone at the reply: {populated}"
    );
    assert_eq!(summary.killed, 1);
}

#[test]
fn adopting_a_busy_tree_leaves_no_entry_behind() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    // Children that exit about as fast as /proc can be read: some are found while exiting.
    let busy = "while :; do (:) & (:) & (:) & wait; done";
    for trial in 0..20 {
        let cgroup = Cgroup::new("busy");
        let mut root = cgroup.command("sh", &["-c", busy]).spawn().unwrap();
        let scenario = Scenario {
            tree: tracker.adopt(root.id()).expect("adopting the busy shell"),
            root: {
                // Moved into the scenario so it is reaped however the test ends.
                let placeholder = std::process::Command::new("true").spawn().unwrap();
                std::mem::replace(&mut root, placeholder)
            },
            cgroup,
        };
        let _ = root.wait();
        let killed = tracker.kill(scenario.tree, Duration::ZERO);
        assert!(
            killed.is_ok(),
            "trial {trial}: the kill did not empty the tree: {killed:?}; left in the map: {:?}",
            tracker.member_pids(scenario.tree)
        );
        assert!(scenario.cgroup.procs().is_empty(), "trial {trial}");
        tracker.release(scenario.tree).unwrap();
    }
}
