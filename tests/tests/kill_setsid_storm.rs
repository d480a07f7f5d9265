//! Killing a fork chain that calls setsid at every hop while it is still growing: nothing
//! survives, in every trial. The cgroup is the referee.

use std::time::Duration;

use leash_tests::{Scenario, chain_command, tracker, wait_for};

const TRIALS: usize = 20;
/// Kill once the chain has at least this many processes (and it is still forking).
const KILL_AT: usize = 300;

#[test]
fn a_growing_setsid_chain_leaves_no_survivor() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let mut times = Vec::new();
    for trial in 0..TRIALS {
        // Deep enough that it is still forking when the kill starts.
        let (cgroup, command) = chain_command("kill-storm", 5000, Some("setsid"));
        let mut scenario = Scenario::spawn_command(&mut tracker, cgroup, command);
        assert!(
            wait_for(Duration::from_secs(60), || scenario.cgroup.procs().len()
                >= KILL_AT),
            "the chain did not grow"
        );
        let report = tracker.kill(scenario.tree, Duration::ZERO).expect("kill");
        let _ = scenario.root.wait();
        // Processes still in the group once their exits have gone through.
        wait_for(Duration::from_secs(5), || {
            scenario.cgroup.procs().is_empty()
        });
        let survivors = scenario.cgroup.procs().len();
        eprintln!(
            "trial {trial}: killed {} in {} rounds, {:?}, survivors {survivors}",
            report.killed, report.rounds, report.elapsed
        );
        assert_eq!(survivors, 0, "trial {trial}: survivors after the kill");
        times.push(report.elapsed);
        tracker.release(scenario.tree).unwrap();
    }
    times.sort();
    eprintln!(
        "setsid storm: {TRIALS}/{TRIALS} trials with 0 survivors, median kill {:?}",
        times[TRIALS / 2]
    );
}
