//! A fork chain that calls setsid at every hop, killed through the daemon while it is still
//! growing: 0 survivors in 20 of 20 trials.

use std::time::Duration;

use leash_client::TreeOptions;
use leash_tests::{chain_command, daemon::Daemon, wait_for};

const TRIALS: usize = 20;
const KILL_AT: usize = 1000;

#[test]
fn a_setsid_storm_leaves_no_survivor() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let mut times = Vec::new();
    for trial in 0..TRIALS {
        let (cgroup, mut command) = chain_command("storm-daemon", 5000, Some("setsid"));
        let (tree, mut root) = host.spawn(&mut command, &TreeOptions::default()).unwrap();
        assert!(
            wait_for(Duration::from_secs(60), || cgroup.procs().len() >= KILL_AT),
            "the chain did not grow"
        );
        let summary = host.kill(tree, Some(Duration::ZERO)).expect("kill");
        let _ = root.wait();
        cgroup.wait_empty(Duration::from_secs(5));
        let survivors = cgroup.procs().len();
        eprintln!("trial {trial}: {summary:?}, survivors {survivors}");
        assert_eq!(survivors, 0, "trial {trial}");
        times.push(summary.elapsed_ms);
    }
    times.sort();
    eprintln!(
        "setsid storm via the daemon: {TRIALS}/{TRIALS} with 0 survivors, median {} ms to an empty tree",
        times[TRIALS / 2]
    );
}
