//! `leash run` exits as its command did: its exit code, or 128+N when a signal N ended it,
//! as a shell reports it.

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, path_str, setpriv_args},
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
