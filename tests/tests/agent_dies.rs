//! The agent dies, its tools do not live on: host -> agent -> a shell that calls setsid -> a
//! long sleep, a Python loop, `tail -f` and a double-forked daemon. SIGKILL the agent: every
//! member is gone within a second (the cgroup is the referee).

use std::time::Duration;

use leash_client::TreeOptions;
use leash_tests::{Cgroup, daemon::Daemon, python};

const TRIALS: usize = 5;
const AGENT: &str = r#"
setsid sh -c '
  sleep 600 &
  "$PYTHON" -c "import time
while True: time.sleep(0.05)" &
  tail -f /dev/null &
  (sleep 600 &)
  wait' &
wait
"#;

#[test]
fn killing_the_agent_kills_its_tools() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let mut times = Vec::new();
    for trial in 0..TRIALS {
        let cgroup = Cgroup::new("agent-dies");
        let (tree, mut agent) = host
            .spawn(
                cgroup.command("sh", &["-c", AGENT]).env("PYTHON", python()),
                &TreeOptions::default(),
            )
            .expect("spawning the agent");
        // agent sh, setsid'd sh, sleep, python, tail, the double-forked sleep
        cgroup.settle_exactly(&["sh", "sh", "sleep", "sleep", "python", "tail"]);
        let tracked: usize = host
            .list()
            .unwrap()
            .iter()
            .filter(|t| t.tree == tree)
            .map(|t| t.members.len())
            .sum();
        assert_eq!(tracked, 6, "every tool is a member before the agent dies");

        agent.kill().unwrap();
        let emptied = cgroup.wait_empty(Duration::from_secs(5));
        let _ = agent.wait();
        let survivors = cgroup.procs().len();
        eprintln!(
            "trial {trial}: agent SIGKILLed, tree empty after {emptied:?}, survivors {survivors}"
        );
        let emptied = emptied.expect("the tools outlived the agent");
        assert!(
            emptied < Duration::from_secs(1),
            "trial {trial}: {emptied:?}"
        );
        times.push(emptied);
    }
    times.sort();
    eprintln!(
        "agent dies: {TRIALS}/{TRIALS} with 0 survivors, median {:?} from SIGKILL to an empty tree",
        times[TRIALS / 2]
    );
}
