//! The host is SIGKILLed while its agent waits in a shell loop for a file and would then write
//! a marker. The file appears after the kill; the marker never does.

use std::{fs, time::Duration};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, path_str},
};

const TRIALS: usize = 5;

#[test]
fn the_agent_never_acts_after_its_host_died() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut times = Vec::new();
    for trial in 0..TRIALS {
        let file = daemon.dir.join(format!("go-{trial}"));
        let marker = daemon.dir.join(format!("marker-{trial}"));
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

        host.kill().unwrap();
        let emptied = cgroup.wait_empty(Duration::from_secs(10));
        let _ = host.wait();
        eprintln!("trial {trial}: host SIGKILLed mid-wait, agent gone after {emptied:?}");
        times.push(emptied.expect("the agent outlived its host"));
        fs::write(&file, "now").unwrap();
        // Nothing of the tree is left to see the file.
        assert!(cgroup.procs().is_empty());
        assert!(!marker.exists(), "the agent acted after its host died");
    }
    times.sort();
    eprintln!(
        "host killed mid-wait: {TRIALS}/{TRIALS} without the marker, median {:?} to an empty tree",
        times[TRIALS / 2]
    );
}
