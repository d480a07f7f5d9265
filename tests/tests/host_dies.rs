//! The host dies without closing: its agent ignores SIGTERM, SIGHUP and stdin EOF and runs in a
//! session of its own. SIGKILL the host (`leash run`): the agent is killed anyway.

use std::{process::Stdio, time::Duration};

use leash_tests::{Cgroup, daemon::Daemon};

const STUBBORN_AGENT: &str =
    r#"trap "" TERM HUP; sleep 600 & while read line; do :; done; exec sleep 600"#;

#[test]
fn sigkilling_the_host_kills_its_stubborn_agent() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
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
    cgroup.settle(2, &["sleep"]);

    host.kill().unwrap();
    let _ = host.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host SIGKILLed (grace 300 ms, agent ignores SIGTERM): tree empty after {emptied:?}");
    let emptied = emptied.expect("the agent outlived its host");
    assert!(
        emptied >= Duration::from_millis(300),
        "SIGKILL came before the grace ended: {emptied:?}"
    );
}
