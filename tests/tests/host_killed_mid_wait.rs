//! The host is SIGKILLed while its agent waits in a shell loop for a file and would then write
//! a marker. The file appears after the kill; the marker never does.

use std::{fs, time::Duration};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, path_str},
};

#[test]
fn the_agent_never_acts_after_its_host_died() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let file = daemon.dir.join("go");
    let marker = daemon.dir.join("marker");
    let script = format!(
        r#"while [ ! -e "{}" ]; do sleep 0.01; done; echo acted > "{}""#,
        path_str(&file),
        path_str(&marker)
    );
    let cgroup = Cgroup::new("host-mid-wait");
    let mut host = daemon
        .leash()
        .args(["run", "--"])
        .args(cgroup.argv("setsid", &["sh", "-c", &script]))
        .spawn()
        .unwrap();
    // The agent is in its loop (between polls it is one shell; during one, it has a sleep).
    cgroup.settle(1, &["sh"]);
    assert!(!marker.exists());

    host.kill().unwrap();
    let _ = host.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host SIGKILLed mid-wait: agent gone after {emptied:?}");
    assert!(emptied.is_some(), "the agent outlived its host");
    fs::write(&file, "now").unwrap();
    // Nothing of the tree is left to see the file.
    assert!(cgroup.procs().is_empty());
    assert!(!marker.exists(), "the agent acted after its host died");
}
