//! Quiet, honest output: a printing command whose reader is gone (`leash ls | head`) ends
//! quietly with status 0, as ps and systemctl do, not with `leash: Broken pipe`; `leash run`
//! and `leash track` take their command with or without `--`; `leash track`, which needs no
//! ptrace guard, loads none and says nothing of one; a `leash run` with no daemon names
//! `leash doctor`; a daemon's start says its guard and its membership once each, and not its
//! open file limit.

use std::{
    io::Read,
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::Duration,
};

use leash_tests::{
    daemon::{Daemon, path_str},
    leash_binary, wait_for,
};

/// Waits for `child` (a minute at most: each of these is quick), returning its status and
/// stderr.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut stderr = child.stderr.take().expect("stderr piped");
    let reader = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut status = None;
    let done = wait_for(Duration::from_secs(60), || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if !done {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{child:?} did not finish within a minute");
    }
    (status.unwrap(), reader.join().unwrap())
}

/// Runs `command` with stdout a pipe whose read end is already closed: its first write fails
/// with EPIPE.
fn with_stdout_closed(mut command: Command) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = command
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The command's copy of the write end is its own: this one goes.
    drop(command);
    finish(child)
}

#[test]
fn a_printing_command_whose_reader_is_gone_ends_quietly() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let socket = path_str(&daemon.socket);
    for argv in [
        &["ls"][..],
        &["ls", "--json"],
        &["status"],
        &["status", "--json"],
        &["completions", "bash"],
        &["--help"],
        &["--version"],
    ] {
        let mut command = Command::new(leash_binary());
        command.args(["--socket", socket]).args(argv);
        let (status, stderr) = with_stdout_closed(command);
        assert_eq!(stderr, "", "leash {argv:?} said on stderr");
        assert!(status.success(), "leash {argv:?}: {status}");
    }
}

/// `leash run` takes its command as systemd-run, timeout and docker run do: after `--` or
/// not; its own options come before the command, and what follows the command's name is the
/// command's, options too.
#[test]
fn leash_run_takes_its_command_with_or_without_dashes() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let run = |args: &[&str]| {
        let child = daemon
            .leash()
            .arg("run")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, stderr) = finish(child);
        (status.code(), stderr)
    };
    assert_eq!(run(&["sh", "-c", "exit 3"]), (Some(3), String::new()));
    assert_eq!(run(&["--", "sh", "-c", "exit 4"]), (Some(4), String::new()));
    assert_eq!(
        run(&["--grace", "1", "sh", "-c", "exit 5"]),
        (Some(5), String::new())
    );
    // `--grace 5` after the command's name is the command's: two arguments.
    assert_eq!(
        run(&["sh", "-c", "exit $#", "sh", "--grace", "5"]),
        (Some(2), String::new())
    );
}

#[test]
fn leash_track_takes_its_command_without_dashes_and_says_nothing_of_a_guard() {
    // Fails (or skips, on opt-out) like every BPF test when BPF cannot be loaded.
    let Some(probe) = leash_tests::tracker!() else {
        return;
    };
    drop(probe);
    for dashes in [&[][..], &["--"]] {
        let child = Command::new(leash_binary())
            .arg("track")
            .args(dashes)
            .args(["sh", "-c", "exit 3"])
            .env_remove("LEASH_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, stderr) = finish(child);
        assert_eq!(status.code(), Some(3), "{dashes:?}: {stderr}");
        assert!(
            !stderr.contains("guard"),
            "{dashes:?}: track needs no ptrace guard, and says nothing of one:\n{stderr}"
        );
    }
}

#[test]
fn a_run_with_no_daemon_names_leash_doctor() {
    let socket = format!("/nonexistent/leash-quiet-{}/leash.sock", std::process::id());
    let child = Command::new(leash_binary())
        .args(["--socket", &socket, "run", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, stderr) = finish(child);
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(stderr.contains(&socket), "{stderr}");
    assert!(stderr.contains("`leash doctor`"), "{stderr}");
}

/// At INFO, a start says which ptrace guard is in place once, and why the better ones are not
/// on the same line; the membership once; the open file limit only if it is low.
#[test]
fn a_daemon_start_says_its_guard_and_membership_once_each() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let log = daemon.log();
    let start: Vec<&str> = log
        .lines()
        .take_while(|line| !line.contains("leash daemon serving"))
        .collect();
    let said = |what: &str| start.iter().filter(|line| line.contains(what)).count();
    // (On a kernel that may skip fmod_ret, a kprobe beside it failing is a warning of its own.)
    let guard_lines = start
        .iter()
        .filter(|line| line.contains("ptrace guard") && !line.contains("beside"))
        .count();
    assert_eq!(guard_lines, 1, "{log}");
    assert_eq!(said(" guard="), 1, "{log}");
    assert_eq!(said(" membership="), 1, "{log}");
    assert_eq!(said("membership"), 1, "{log}");
    let limit = start.iter().find(|line| line.contains("open file limit"));
    assert!(
        limit.is_none_or(|line| line.contains(" WARN ")),
        "the open file limit is news only when low: {log}"
    );
    // A guard in place is not a warning (its line says what it leaves open), no guard is.
    for line in start.iter().filter(|line| line.contains(" guard=")) {
        assert_eq!(
            line.contains(" WARN "),
            line.contains("guard=\"none\""),
            "{line}"
        );
    }
}
