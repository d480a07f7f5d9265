//! A pid recycled after a member died is never signalled: the member left the kernel map when
//! it died, and every signal goes through a pidfd whose process is checked by start time.

use std::{fs, time::Duration};

use leash_client::TreeOptions;
use leash_tests::{
    Cgroup,
    daemon::{Daemon, alive, signal},
    wait_for,
};

const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

#[test]
fn a_recycled_pid_is_never_signalled() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let cgroup = Cgroup::new("recycle");
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "sleep 600 & sleep 600 & wait"]),
            &TreeOptions::default(),
        )
        .unwrap();
    let procs = cgroup.settle_exactly(&["sh", "sleep", "sleep"]);
    let victim = *procs.iter().find(|&&p| p != root.id()).unwrap();

    // The member dies (its parent reaps it) and leaves the tree.
    signal(victim, "KILL");
    assert!(wait_for(Duration::from_secs(10), || !alive(victim)
        && leash::proc::process(victim).is_none()));
    assert!(wait_for(Duration::from_secs(10), || {
        host.list()
            .unwrap()
            .iter()
            .all(|t| t.tree != tree || t.members.iter().all(|m| m.pid != victim))
    }));

    // An unrelated process takes its pid.
    let outsider_group = Cgroup::new("recycle-outsider");
    let mut outsider = None;
    for _ in 0..50 {
        fs::write(NS_LAST_PID, (victim - 1).to_string()).expect("writing ns_last_pid (needs root)");
        let child = outsider_group.command("sleep", &["600"]).spawn().unwrap();
        if child.id() == victim {
            outsider = Some(child);
            break;
        }
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut outsider = outsider.expect("could not get the dead member's pid reused");
    eprintln!("pid {victim} died as a member and was reused by an outsider");

    let summary = host.kill(tree, Some(Duration::ZERO)).unwrap();
    let _ = root.wait();
    assert!(cgroup.procs().is_empty(), "the tree is gone");
    assert!(
        alive(victim),
        "the outsider with the recycled pid was signalled"
    );
    assert!(outsider.try_wait().unwrap().is_none());
    eprintln!("kill {summary:?}: the outsider with pid {victim} lives on");
    let _ = outsider.kill();
    let _ = outsider.wait();
}
