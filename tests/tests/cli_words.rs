//! What `leash run`, `leash exec`, `leash kill` and `leash watch` say when things go wrong,
//! and the exit statuses that go with it: a command not found (127) or not executable (126)
//! said as a shell says it, a tree killed from outside, a pid given where a tree's id was
//! meant, a live view with no terminal. User space only (LEFT_OUT of the guests' runs).

use std::{
    io::Read,
    process::Stdio,
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, signal as signal_process},
    leash_binary, wait_for,
};

/// `leash run -- CMD` with a CMD that never runs: its exit code and stderr.
fn run_unstartable(daemon: &Daemon, command: &str) -> (Option<i32>, String) {
    let output = daemon
        .leash()
        .args(["run", "--", command])
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// As a shell: 127 and `CMD: command not found` for a command that is nowhere, 126 and the
/// reason for one that is there but cannot be executed. Before, both were `leash: starting the
/// command: No such file or directory (os error 2)` and 125, the code of leash's own failures.
#[test]
fn leash_run_says_as_a_shell_when_its_command_cannot_run() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let (code, stderr) = run_unstartable(&daemon, "leash-no-such-command");
    assert_eq!(code, Some(127), "{stderr}");
    assert_eq!(stderr, "leash: leash-no-such-command: command not found\n");

    let missing = daemon.dir.join("missing");
    let (code, stderr) = run_unstartable(&daemon, path_str(&missing));
    assert_eq!(code, Some(127), "{stderr}");
    assert_eq!(
        stderr,
        format!("leash: {}: No such file or directory\n", missing.display())
    );

    // Not executable, even by root: no execute bit at all.
    let script = daemon.dir.join("not-executable");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let (code, stderr) = run_unstartable(&daemon, path_str(&script));
    assert_eq!(code, Some(126), "{stderr}");
    assert_eq!(
        stderr,
        format!("leash: {}: Permission denied\n", script.display())
    );

    let (code, stderr) = run_unstartable(&daemon, path_str(&daemon.dir));
    assert_eq!(code, Some(126), "{stderr}");
    assert_eq!(
        stderr,
        format!("leash: {}: Is a directory\n", daemon.dir.display())
    );
}

/// A tree killed from outside (here by `leash kill`) ends its command with SIGTERM: `leash run`
/// exits 143 as before, and now says why on stderr, so that the status does not read like the
/// command's own crash.
#[test]
fn leash_run_says_when_its_tree_was_killed_from_outside() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("run-killed");
    let run = daemon
        .leash()
        .args(["run", "--grace", "1", "--"])
        .args(cgroup.argv("sleep", &["600"]))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = cgroup.settle_exactly(&["sleep"]);
    let root = *pids.first().unwrap();
    let mut viewer = daemon.client();
    let mut tree = None;
    assert!(
        wait_for(Duration::from_secs(10), || {
            tree = viewer
                .list()
                .unwrap()
                .iter()
                .find(|t| t.root == root)
                .map(|t| t.tree);
            tree.is_some()
        }),
        "the tree of leash run is not listed"
    );
    let tree = tree.unwrap().to_string();
    let killed = daemon.leash().args(["kill", &tree]).output().unwrap();
    assert!(killed.status.success(), "{killed:?}");
    // What the kill did, in a person's words: its time and its signals, not its rounds.
    let said = String::from_utf8_lossy(&killed.stdout);
    assert!(
        said.starts_with(&format!("tree {tree}: killed in ")) && said.contains("SIGTERM to "),
        "{said}"
    );
    assert!(!said.contains("round"), "{said}");
    let (status, stderr) = ended(run);
    assert_eq!(status, Some(143), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "leash: tree {tree} was killed (a kill was requested: leash kill, K in leash \
             watch, or a host's kill)\n"
        )
    );
}

/// The daemon's shutdown (SIGTERM) kills every tree: `leash run` says so.
#[test]
fn leash_run_says_when_the_daemon_shut_down() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("run-shutdown");
    let run = daemon
        .leash()
        // A bare number is seconds: a grace, so SIGTERM first.
        .args(["run", "--grace", "0.5", "--"])
        .args(cgroup.argv("sleep", &["600"]))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let root = *cgroup.settle_exactly(&["sleep"]).first().unwrap();
    let mut viewer = daemon.client();
    assert!(
        wait_for(Duration::from_secs(10), || viewer
            .list()
            .unwrap()
            .iter()
            .any(|t| t.root == root)),
        "the tree of leash run is not listed"
    );
    drop(viewer);
    assert!(daemon.stop(), "the daemon did not stop cleanly");
    let (status, stderr) = ended(run);
    assert_eq!(status, Some(143), "{stderr}");
    assert!(
        stderr.starts_with("leash: tree ")
            && stderr.ends_with(" was killed (the daemon shut down)\n"),
        "{stderr}"
    );
}

/// The exit code and stderr of `leash run` (its stderr piped), once it has exited.
fn ended(mut run: std::process::Child) -> (Option<i32>, String) {
    let status = run.wait().unwrap();
    let mut stderr = String::new();
    run.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stderr)
}

/// `leash kill PID` given the pid of a tree's member, not a tree's id, says which tree that
/// process is in; to a user who may not see that tree, only that there is no such tree.
#[test]
fn leash_kill_of_a_member_s_pid_names_its_tree() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("kill-member-pid");
    let mut run = daemon
        .leash_as(
            USER_A,
            &cgroup,
            &["run", "--grace", "0", "--", "sh", "-c", "sleep 600 & wait"],
        )
        .spawn()
        .unwrap();
    cgroup.settle_exactly(&["leash", "sh", "sleep"]);
    let trees = daemon.client().list().unwrap();
    let [tree] = trees.as_slice() else {
        panic!("one tree expected: {trees:?}");
    };
    let sleep = tree
        .members
        .iter()
        .find(|m| m.comm.as_deref() == Some("sleep"))
        .expect("the sleep in the tree")
        .pid;
    let kill = |argv: &mut std::process::Command| {
        let output = argv.output().unwrap();
        assert!(!output.status.success());
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = kill(daemon.leash().args(["kill", &sleep.to_string()]));
    assert_eq!(
        said,
        format!(
            "leash: no tree {sleep}; process {sleep} is a member of tree {0}: leash kill {0}\n",
            tree.tree
        )
    );
    // Another user does not see the tree, so is not told of it.
    let stranger = Cgroup::new("kill-member-stranger");
    let said = kill(
        daemon
            .leash_as(USER_B, &stranger, &["kill", &sleep.to_string()])
            .stderr(Stdio::piped()),
    );
    assert_eq!(said, format!("leash: no tree {sleep}\n"));
    // The tree is untouched by either.
    assert_eq!(cgroup.procs().len(), 3);
    signal_process(run.id(), "TERM");
    let _ = run.wait();
}

/// Without a status descriptor, the shim says it on stderr, as a shell would.
#[test]
fn a_shim_says_why_its_command_cannot_be_executed() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let host = daemon.client();
    for (command, status, said) in [
        (
            "leash-no-such-agent",
            127,
            "leash: leash-no-such-agent: command not found\n",
        ),
        ("/", 126, "leash: /: Is a directory\n"),
    ] {
        let output = daemon
            .leash()
            .args(["exec", "--", command])
            .env("LEASH_LEASE", &host.lease().token)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(status), "{command}: {stderr}");
        assert_eq!(stderr, said);
    }
}

/// `leash watch` with no terminal (a pipe, a script, a service) says what to use instead, at
/// once and before it connects; before, it failed with `No such device or address (os error
/// 6)`.
#[test]
fn leash_watch_without_a_terminal_points_to_json() {
    let started = Instant::now();
    let output = std::process::Command::new(leash_binary())
        .args(["--socket", "/nonexistent/leash.sock", "watch"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "leash: leash watch needs a terminal; use leash watch --json for a stream of events\n"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
