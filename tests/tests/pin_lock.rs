//! One daemon per pin directory. A second daemon on a live daemon's pins would take its trees
//! for its own, and kill them when it stopped; it is refused before it touches the pins, naming
//! the daemon that holds them. The lock passes on when its holder exits: at a hand-over, and
//! after a SIGKILL.

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use leash_tests::{Cgroup, daemon::Daemon, leash_binary, wait_for};

/// `leash run -- sh -c 'setsid sleep 600 & wait'` inside `cgroup`, settled.
fn leashed_tree(daemon: &Daemon, cgroup: &Cgroup) -> Child {
    let host = daemon
        .leash()
        .args(["run", "--"])
        .args(cgroup.argv("sh", &["-c", "setsid sleep 600 & wait"]))
        .spawn()
        .unwrap();
    cgroup.settle_exactly(&["sh", "sleep"]);
    host
}

/// Starts a second daemon on `daemon`'s pins (with a socket of its own) and returns how it
/// ended. One that is not refused is stopped after a while, and fails the test.
fn second_daemon(daemon: &Daemon) -> Output {
    let socket = daemon.dir.join("second.sock");
    let mut second = Command::new(leash_binary())
        .args(["daemon", "--socket"])
        .arg(&socket)
        .arg("--pin-dir")
        .arg(&daemon.pins)
        .env("LEASH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = wait_for(Duration::from_secs(30), || {
        second.try_wait().ok().flatten().is_some()
    });
    if !ended {
        let _ = second.kill();
    }
    let output = second.wait_with_output().unwrap();
    assert!(
        ended,
        "a second daemon on live pins was not refused; it said:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !socket.exists(),
        "the refused daemon leaves no socket behind"
    );
    output
}

/// The refusal: exit status 78 (the unit does not restart it), the holder's pid and socket,
/// and the ways out.
fn assert_refused_naming_the_holder(output: &Output, daemon: &Daemon) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    for part in [
        &format!("pid {}", daemon.pid()),
        &format!("socket {}", daemon.socket.display()),
        "--pin-dir",
        "--no-pin",
    ] {
        assert!(stderr.contains(part), "the refusal names {part}:\n{stderr}");
    }
}

/// The host dies; its tree goes with it.
fn assert_enforced(mut host: Child, cgroup: &Cgroup, after: &str) {
    host.kill().unwrap();
    let _ = host.wait();
    assert!(
        cgroup.wait_empty(Duration::from_secs(10)).is_some(),
        "the tree outlived its host {after}"
    );
}

#[test]
fn a_second_daemon_on_live_pins_is_refused_and_the_first_still_enforces() {
    let Some(daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("pin-lock-second");
    let host = leashed_tree(&daemon, &cgroup);

    assert_refused_naming_the_holder(&second_daemon(&daemon), &daemon);
    let status = daemon.client().status().unwrap();
    assert_eq!(status.trees, 1);
    assert_eq!(status.pins_missing, Vec::<String>::new(), "nothing removed");
    assert_enforced(host, &cgroup, "after a second daemon was refused");
}

#[test]
fn a_hand_over_passes_the_lock_to_the_next_daemon() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("pin-lock-hup");
    let host = leashed_tree(&daemon, &cgroup);

    assert!(daemon.hand_over(), "the daemon exits cleanly on SIGHUP");
    // Refused here if the old daemon had left its lock behind.
    daemon.restart();
    assert!(
        daemon
            .log()
            .contains("took over the pinned programs and maps")
    );
    assert_refused_naming_the_holder(&second_daemon(&daemon), &daemon);
    assert_enforced(host, &cgroup, "after a hand-over");
}

#[test]
fn a_sigkilled_daemons_lock_is_taken_by_the_next() {
    let Some(mut daemon) = Daemon::start(&["--grace", "0"]) else {
        return;
    };
    let cgroup = Cgroup::new("pin-lock-kill");
    let host = leashed_tree(&daemon, &cgroup);

    daemon.kill_hard();
    daemon.restart();
    assert_refused_naming_the_holder(&second_daemon(&daemon), &daemon);
    assert_enforced(host, &cgroup, "after its daemon was SIGKILLed");
}

#[test]
fn status_says_when_the_pins_are_gone() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let pinned_at = daemon.client().status().unwrap().pinned_at.unwrap();
    // As a purge or a hand would.
    std::fs::remove_dir_all(Path::new(&pinned_at)).unwrap();

    let status = daemon.client().status().unwrap();
    assert!(!status.pins_missing.is_empty(), "{status:?}");
    let text = daemon.leash().arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("of its pins are gone"), "{text}");
    assert!(
        !text.contains("tracking goes on if the daemon dies"),
        "{text}"
    );
}
