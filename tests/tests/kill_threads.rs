//! A kill is over when the kernel says every thread of every member has exited, not when a
//! member's main thread reads as a zombie. Two members make the difference: one whose main
//! thread exited first while another thread holds its memory, and one with four threads, a
//! listening port and 1 GiB of memory. At the kill's reply, `cgroup.events` must say
//! `populated 0` (`cgroup.procs` hides a dying leader; `populated` does not), and the port
//! must be free.

use std::{fs, net::TcpListener, time::Duration};

use leash_tests::{Removed, Scenario, python, tracker, wait_for};

const TRIALS: usize = 3;

/// argv: PORT READY_FILE. Two processes: the first's main thread exits, leaving a thread with
/// 512 MiB; the second listens on PORT from one of four threads, holding 1 GiB.
const MEMBERS: &str = r#"
import ctypes, os, socket, sys, threading, time
port, ready = int(sys.argv[1]), sys.argv[2]
def forever():
    while True:
        time.sleep(60)
if os.fork() == 0:
    ballast = b"y" * (512 << 20)
    threading.Thread(target=forever).start()
    ctypes.CDLL(None).pthread_exit(None)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen()
ballast = b"x" * (1 << 30)
for _ in range(3):
    threading.Thread(target=forever).start()
open(ready, "w").close()
forever()
"#;

#[test]
fn the_kill_reports_when_every_thread_has_exited() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let ready = Removed(
        std::env::temp_dir().join(format!("leash-test-{}-threads-ready", std::process::id())),
    );
    for trial in 0..TRIALS {
        let _ = fs::remove_file(&ready.0);
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let port_arg = port.to_string();
        let mut scenario = Scenario::spawn(
            &mut tracker,
            "kill-threads",
            &python(),
            &["-c", MEMBERS, &port_arg, ready.0.to_str().unwrap()],
        );
        let events = scenario.cgroup.procs_file().with_file_name("cgroup.events");
        let leader_exited = || {
            scenario.cgroup.procs().iter().any(|&pid| {
                leash::proc::process(pid).is_some_and(|p| p.state == 'Z')
                    && leash_tests::thread_count(pid) > 1
            })
        };
        assert!(
            wait_for(Duration::from_secs(60), || ready.0.exists()
                && leader_exited()),
            "the members did not start"
        );

        tracker.kill(scenario.tree, Duration::ZERO).unwrap();
        let populated = fs::read_to_string(&events).unwrap();
        let port_free = TcpListener::bind(("127.0.0.1", port)).is_ok();
        let _ = scenario.root.wait();
        eprintln!(
            "trial {trial}: at the kill's report: {}, port free: {port_free}",
            populated.lines().next().unwrap_or_default()
        );
        assert!(
            populated.contains("populated 0"),
            "reported while threads were still exiting: {populated}"
        );
        assert!(port_free, "reported while the port was held");
    }
}
