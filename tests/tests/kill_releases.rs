//! A kill is reported when its members have finished exiting, not merely when they stopped
//! running code: a host told "empty" may restart its agent at once, on the same port.
//!
//! The member holds a listening socket and 1 GiB of touched memory. The kernel drops the memory
//! before it closes the files, and only then takes the process out of its cgroup, so a report
//! made at `sched_process_exit` would come while the port is still taken.

use std::{
    fs,
    net::TcpListener,
    time::{Duration, Instant},
};

use leash_tests::{Removed, Scenario, python, tracker, wait_for};

const TRIALS: usize = 5;

#[test]
fn the_kill_ends_after_the_members_port_and_memory_are_released() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let ready =
        Removed(std::env::temp_dir().join(format!("leash-test-{}-listening", std::process::id())));
    let script = r#"
import socket, sys, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
ballast = b"x" * (1 << 30)
open(sys.argv[2], "w").close()
while True:
    time.sleep(60)
"#;
    for trial in 0..TRIALS {
        let _ = fs::remove_file(&ready.0);
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let port_arg = port.to_string();
        let ready_arg = ready.0.to_str().unwrap();
        let mut scenario = Scenario::spawn(
            &mut tracker,
            "kill-releases",
            &python(),
            &["-c", script, &port_arg, ready_arg],
        );
        assert!(
            wait_for(Duration::from_secs(60), || ready.0.exists()),
            "the member did not start listening"
        );
        assert!(
            TcpListener::bind(("127.0.0.1", port)).is_err(),
            "the member holds the port"
        );

        let started = Instant::now();
        let report = tracker.kill(scenario.tree, Duration::ZERO).unwrap();
        let in_cgroup = scenario.cgroup.procs();
        let rebound = TcpListener::bind(("127.0.0.1", port));
        eprintln!(
            "trial {trial}: kill reported after {:?}; still in the cgroup: {in_cgroup:?}; port free: {}",
            started.elapsed(),
            rebound.is_ok()
        );
        let _ = scenario.root.wait();
        assert!(
            in_cgroup.is_empty(),
            "reported empty while members were exiting"
        );
        assert!(
            rebound.is_ok(),
            "reported empty while the port was held: {rebound:?}"
        );
        assert_eq!(report.killed, 1);
    }
}
