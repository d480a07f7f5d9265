//! `leash run` exits as its command did: its exit code, or 128+N when a signal N ended it,
//! as a shell reports it.

use leash_tests::daemon::Daemon;

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
