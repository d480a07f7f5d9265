//! The daemon may die and come back. Its pinned programs go on following forks while no daemon
//! runs, and the daemon started next holds the trees again: what happened meanwhile (a fork
//! into a new session, a host's death, a root's exit) is enforced then. SIGHUP does the same on
//! purpose: a hand-over that kills nothing.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use leash_client::{ClosingReason, Error, EventKind, RootExitPolicy, TreeOptions};
use leash_tests::{
    Cgroup, Removed, Scenario,
    daemon::{Daemon, path_str},
    load_pinned_tracker, wait_for,
};

/// The tree's members as the daemon lists them.
fn listed_members(daemon: &Daemon) -> BTreeSet<u32> {
    daemon
        .client()
        .list()
        .unwrap()
        .iter()
        .flat_map(|tree| tree.members.iter().map(|m| m.pid))
        .collect()
}

/// `leash run -- sh -c SCRIPT` inside `cgroup`: the host, a process of its own.
fn leash_run(daemon: &Daemon, cgroup: &Cgroup, script: &str) -> Child {
    daemon
        .leash()
        .args(["run", "--"])
        .args(cgroup.argv("sh", &["-c", script]))
        .spawn()
        .unwrap()
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

#[test]
fn what_was_forked_while_no_daemon_ran_dies_with_its_host() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-fork");
    let go = daemon.dir.join("go");
    mkfifo(&go);
    // The agent: a sleep now; once told, another in a session of its own.
    let script = format!(
        "sleep 600 & read line < {}; setsid sleep 601 & wait",
        go.display()
    );
    let mut host = leash_run(&daemon, &cgroup, &script);
    cgroup.settle_exactly(&["sh", "sleep"]);

    daemon.kill_hard();
    fs::write(&go, "go\n").unwrap();
    let truth = cgroup.settle_exactly(&["sh", "sleep", "sleep"]);

    daemon.restart();
    assert_eq!(
        listed_members(&daemon),
        truth,
        "the new daemon holds the tree, with the process forked while none ran"
    );
    assert!(
        daemon
            .log()
            .contains("took over the pinned programs and maps")
    );

    host.kill().unwrap();
    let _ = host.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host SIGKILLed after a daemon restart: tree empty after {emptied:?}");
    assert!(emptied.is_some(), "the tree outlived its host");

    assert!(daemon.stop(), "the daemon stops cleanly");
    let left = fs::read_dir(&daemon.pins).map_or(0, |dir| dir.count());
    assert_eq!(left, 0, "a clean stop removes the pins");
}

#[test]
fn a_host_that_died_while_no_daemon_ran_loses_its_tree_at_the_restart() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-host");
    let mut host = leash_run(&daemon, &cgroup, "setsid sleep 600 & wait");
    cgroup.settle_exactly(&["sh", "sleep"]);

    daemon.kill_hard();
    host.kill().unwrap();
    let _ = host.wait();
    // Nobody enforces anything now.
    assert_eq!(cgroup.procs().len(), 2);

    daemon.restart();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host died while no daemon ran: tree empty {emptied:?} after the restart");
    assert!(emptied.is_some(), "the orphaned tree survived the restart");
}

#[test]
fn a_root_that_exited_while_no_daemon_ran_takes_its_tree_along_at_the_restart() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-root");
    let go = daemon.dir.join("go");
    mkfifo(&go);
    let script = format!("setsid sleep 600 & read line < {}", go.display());
    // This test is the host, and lives on through the restart.
    let mut host = daemon.client();
    let (_tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", &script]),
            &TreeOptions::default(),
        )
        .unwrap();
    cgroup.settle_exactly(&["sh", "sleep"]);

    daemon.kill_hard();
    fs::write(&go, "go\n").unwrap();
    root.wait().unwrap();
    cgroup.settle_exactly(&["sleep"]);

    daemon.restart();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("root exited while no daemon ran: tree empty {emptied:?} after the restart");
    assert!(emptied.is_some(), "the orphan survived its root's exit");
}

#[test]
fn a_hand_over_kills_nothing_and_the_next_daemon_enforces() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-hup");
    let mut host = leash_run(&daemon, &cgroup, "setsid sleep 600 & wait");
    let before = cgroup.settle_exactly(&["sh", "sleep"]);

    assert!(daemon.hand_over(), "the daemon exits cleanly on SIGHUP");
    assert!(daemon.log().contains("handing over"));
    assert_eq!(cgroup.procs(), before, "a hand-over kills nothing");

    daemon.restart();
    assert_eq!(listed_members(&daemon), before);
    host.kill().unwrap();
    let _ = host.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host SIGKILLed after a hand-over: tree empty after {emptied:?}");
    assert!(emptied.is_some(), "the tree outlived its host");
}

/// A host in this process through a hand-over: its connection's last line says its trees were
/// handed over, its next call says they stay enforced, and the next daemon enforces them (the
/// root's exit takes the rest of its tree along).
#[test]
fn a_host_is_told_of_the_hand_over_and_its_tree_stays_enforced() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-told");
    let go = daemon.dir.join("go");
    mkfifo(&go);
    let script = format!("setsid sleep 600 & read line < {}", go.display());
    let mut host = daemon.client();
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", &script]),
            &TreeOptions::default(),
        )
        .unwrap();
    cgroup.settle_exactly(&["sh", "sleep"]);

    assert!(daemon.hand_over(), "the daemon exits cleanly on SIGHUP");
    let closing = host
        .next_event(Some(Duration::from_secs(5)))
        .expect("the closing event, before the connection's end")
        .expect("an event, not a timeout");
    assert_eq!(closing.kind, EventKind::Closing, "{closing:?}");
    assert_eq!(
        closing.closing_reason(),
        Some(ClosingReason::HandOver),
        "{closing:?}"
    );
    let error = host.list().expect_err("the connection is closed");
    assert!(
        matches!(error, Error::Closed(Some(ClosingReason::HandOver))),
        "{error:?}"
    );
    assert!(error.to_string().contains("stay enforced"), "{error}");

    daemon.restart();
    let listed = daemon.client().list().unwrap();
    assert!(
        listed.iter().any(|t| t.tree == tree),
        "the next daemon holds the tree: {listed:?}"
    );
    fs::write(&go, "go\n").unwrap();
    root.wait().unwrap();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("root exited after a hand-over: tree empty after {emptied:?}");
    assert!(
        emptied.is_some(),
        "the next daemon did not enforce the tree"
    );
}

#[test]
fn a_tree_keeps_its_policy_grace_and_host_through_a_restart() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-keep");
    let keep = TreeOptions {
        on_root_exit: RootExitPolicy::Keep,
        grace: Some(Duration::from_millis(700)),
    };
    let mut host = daemon.client();
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "setsid sleep 600 & exit 0"]),
            &keep,
        )
        .unwrap();
    root.wait().unwrap();
    let orphan = cgroup.settle_exactly(&["sleep"]);

    daemon.kill_hard();
    daemon.restart();
    let mut observer = daemon.client();
    let mut info = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            info = observer
                .list()
                .unwrap()
                .into_iter()
                .find(|t| t.tree == tree);
            info.as_ref().is_some_and(|t| t.root_exited)
        }),
        "the new daemon saw the root's exit"
    );
    let info = info.unwrap();
    assert_eq!(info.on_root_exit, RootExitPolicy::Keep);
    assert_eq!(info.grace_ms, 700);
    assert_eq!(info.host_pid, std::process::id());
    assert_eq!(cgroup.procs(), orphan, "kept, as its policy says");

    let summary = observer.kill(tree, Some(Duration::ZERO)).unwrap();
    assert_eq!(summary.killed, 1);
    assert!(cgroup.procs().is_empty());
}

#[test]
fn a_kill_under_way_when_the_daemon_died_is_finished_by_the_next() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("restart-resume");
    // Both ignore SIGTERM (an ignored signal stays ignored across exec): SIGKILL must come.
    let stubborn = TreeOptions {
        on_root_exit: RootExitPolicy::Kill,
        grace: Some(Duration::from_millis(1500)),
    };
    let mut host = daemon.client();
    let (tree, _root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "trap '' TERM; setsid sleep 600 & wait"]),
            &stubborn,
        )
        .unwrap();
    cgroup.settle_exactly(&["sh", "sleep"]);
    let mut watcher = daemon.client();
    watcher.subscribe().unwrap();
    // Its daemon dies under it: what it says of that is no concern here.
    let mut killer = daemon
        .leash()
        .args(["kill", &tree.to_string()])
        .stderr(daemon.clients_log())
        .spawn()
        .unwrap();
    loop {
        let event = watcher.next_event(Some(Duration::from_secs(10))).unwrap();
        let event = event.expect("the kill started");
        if event.tree == tree && event.kind == EventKind::KillStarted {
            break;
        }
    }

    // Mid-grace: the tree is doomed (kill_started is sent once it is), not yet SIGKILLed.
    daemon.kill_hard();
    let _ = killer.wait();
    assert_eq!(cgroup.procs().len(), 2);
    daemon.restart();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("kill resumed after a restart: tree empty {emptied:?} after it");
    assert!(emptied.is_some(), "the interrupted kill was not finished");
    // The daemon logs the kill's end once it has seen the exits too.
    assert!(
        wait_for(Duration::from_secs(10), || daemon.log().lines().any(
            |line| {
                line.contains("event=\"tree_killed\"") && line.contains("reason=\"resumed\"")
            }
        )),
        "the kill was not finished as a resumed one"
    );
}

#[test]
fn a_tree_that_no_daemon_recorded_a_holder_for_is_killed_at_the_takeover() {
    let root = Removed(PathBuf::from(format!(
        "/sys/fs/bpf/leash-test-{}-unheld",
        std::process::id()
    )));
    // Registered through the library, as a daemon that died before recording the holder.
    let Some((mut tracker, _)) = load_pinned_tracker(&root.0) else {
        return;
    };
    let scenario = Scenario::spawn(
        &mut tracker,
        "unheld",
        "sh",
        &["-c", "setsid sleep 600 & wait"],
    );
    scenario.cgroup.settle_exactly(&["sh", "sleep"]);
    drop(tracker);

    let daemon = Daemon::start(&["--pin-dir", path_str(&root.0)]).unwrap();
    let emptied = scenario.cgroup.wait_empty(Duration::from_secs(10));
    assert!(
        emptied.is_some(),
        "a tree nobody holds outlived the takeover"
    );
    assert!(daemon.log().contains("no holder recorded"));
}

#[test]
fn sighup_is_ignored_when_nothing_is_pinned() {
    let Some(daemon) = Daemon::start(&["--no-pin"]) else {
        return;
    };
    // Serving first: its socket is bound before its programs load, which takes seconds under
    // emulation (12 s on trixie's 6.12), and a SIGHUP sent meanwhile waits until it serves,
    // beside the SIGTERM this test sends when it gives up waiting.
    assert!(daemon.client().status().is_ok(), "the daemon serves");
    leash_tests::daemon::signal(daemon.pid(), "HUP");
    assert!(wait_for(Duration::from_secs(10), || daemon
        .log()
        .contains("SIGHUP ignored")));
    // Still serving: nothing could have taken over its trees.
    assert!(daemon.client().status().unwrap().pinned_at.is_none());
}
