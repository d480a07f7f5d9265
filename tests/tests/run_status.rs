//! `leash run` exits as its command did: its exit code, or 128+N when a signal N ended it,
//! as a shell reports it; 128+N too when it was sent SIGTERM, SIGINT or SIGHUP, which it
//! forwards as a kill of its tree; and 125, saying why, when leash itself failed (127 and 126,
//! for a command not found or not executable, are in cli_words.rs).

use std::time::{Duration, Instant};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, setpriv_args, signal as signal_process},
};

fn run_status(daemon: &Daemon, script: &str) -> Option<i32> {
    daemon
        .leash()
        .args(["run", "--grace", "0", "--", "sh", "-c", script])
        .status()
        .unwrap()
        .code()
}

#[test]
fn leash_run_exits_with_its_commands_status() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    assert_eq!(run_status(&daemon, "exit 0"), Some(0));
    assert_eq!(run_status(&daemon, "exit 7"), Some(7));
    assert_eq!(run_status(&daemon, "kill -TERM $$"), Some(128 + 15));
    assert_eq!(run_status(&daemon, "kill -KILL $$"), Some(128 + 9));
}

/// At its user's process limit (RLIMIT_NPROC, which counts threads), `leash run` cannot start
/// the thread that registers its command: it says so and exits 125, the code of a `leash run`
/// whose command never ran. Before, it panicked ("failed to spawn thread") and exited 101.
#[test]
fn leash_run_at_the_process_limit_fails_clearly() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("run-nproc");
    let leash = daemon.leash_for_anyone();
    // The uid first (setpriv runs as root, unlimited), then the limit: the user's one process,
    // leash run itself, is all it may have.
    let mut argv = setpriv_args(USER_A);
    argv.extend(
        [
            "prlimit",
            "--nproc=1",
            "--",
            path_str(&leash),
            "--socket",
            path_str(&daemon.socket),
            "run",
            "--",
            "true",
        ]
        .map(String::from),
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let output = cgroup
        .command("setpriv", &argv)
        .current_dir("/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("process limit"), "{stderr}");
}

/// A tree that ignores the polite signals and leaves its session: only a kill of the whole
/// tree, past its grace, ends it.
const STUBBORN: &str = r#"trap "" TERM INT HUP; setsid sleep 1000 & wait"#;

/// `leash run` stands for its tree: SIGTERM (a container runtime's stop, `timeout`), SIGINT
/// (Ctrl-C) and SIGHUP are forwarded as a kill of the tree with its grace, and `leash run`
/// exits 128+N only once every process of the tree is gone. Before, it died at once (or, as a
/// container's pid 1, ignored SIGTERM), and left the tree to the daemon.
#[test]
fn a_stop_signal_to_leash_run_kills_its_tree_before_it_exits() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for (signal, number) in [("TERM", 15), ("INT", 2), ("HUP", 1)] {
        let cgroup = Cgroup::new("run-signal");
        let mut run = daemon
            .leash_as(
                USER_B,
                &cgroup,
                &["run", "--grace", "1s", "--", "sh", "-c", STUBBORN],
            )
            .spawn()
            .unwrap();
        // leash run, the shell, and the sleep in its own session.
        cgroup.settle_exactly(&["leash", "sh", "sleep"]);
        let sent = Instant::now();
        signal_process(run.id(), signal);
        let status = run.wait().unwrap();
        let took = sent.elapsed();
        // The ground truth, the moment leash run is gone: nothing of the tree is left.
        let left = cgroup.procs();
        assert!(
            left.is_empty(),
            "SIG{signal}: leash run exited with its tree still running: {left:?}"
        );
        assert_eq!(status.code(), Some(128 + number), "SIG{signal}: {status:?}");
        assert!(
            took >= Duration::from_millis(900),
            "SIG{signal}: the tree was killed without its grace ({took:?})"
        );
    }
}
