//! The host dies without closing: its agent ignores SIGTERM, SIGHUP and stdin EOF and runs in a
//! session of its own. SIGKILL the host (`leash run`): the agent is killed anyway, once the
//! grace period is over.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use leash_tests::{Cgroup, daemon::Daemon};

const TRIALS: usize = 5;
const STUBBORN_AGENT: &str =
    r#"trap "" TERM HUP; sleep 600 & while read line; do :; done; exec sleep 600"#;

#[test]
fn sigkilling_the_host_kills_its_stubborn_agent() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut times = Vec::new();
    for trial in 0..TRIALS {
        let cgroup = Cgroup::new("host-dies");
        let agent = cgroup.argv("setsid", &["sh", "-c", STUBBORN_AGENT]);
        let mut host = daemon
            .leash()
            .args(["run", "--grace", "300ms", "--"])
            .args(&agent)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        // The agent has read stdin's end and become a TERM-ignoring sleep, beside another one.
        cgroup.settle_exactly(&["sleep", "sleep"]);

        // Timed from before the kill: the daemon may see the host die, and start the grace,
        // before kill() has returned here (on a busy machine, by more than a millisecond).
        let killed = Instant::now();
        host.kill().unwrap();
        let emptied = cgroup
            .wait_empty(Duration::from_secs(10))
            .map(|_| killed.elapsed());
        let _ = host.wait();
        eprintln!(
            "trial {trial}: host SIGKILLed, agent ignores SIGTERM, grace 300 ms: empty after {emptied:?}"
        );
        let emptied = emptied.expect("the agent outlived its host");
        assert!(
            emptied >= Duration::from_millis(300),
            "SIGKILL came before the grace ended: {emptied:?}"
        );
        times.push(emptied);
    }
    times.sort();
    eprintln!(
        "host dies: {TRIALS}/{TRIALS} with 0 survivors, median {:?} (grace 300 ms)",
        times[TRIALS / 2]
    );
}
