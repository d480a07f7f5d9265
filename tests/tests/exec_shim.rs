//! The `leash exec --lease-fd N -- CMD` shim: a host in any language prefixes argv and passes
//! its lease token on a descriptor; the shim registers itself under the host's lease and execs
//! CMD. The tree then lives and dies with that lease. Where the token may and may not appear is
//! tests/tests/secret_token.rs.

use std::{path::Path, process::Command, time::Duration};

use leash_client::EventKind;
use leash_tests::{Cgroup, daemon::Daemon, leash_binary};

#[test]
fn a_shim_spawned_tree_dies_with_its_hosts_lease() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    host.subscribe().unwrap();
    let cgroup = Cgroup::new("exec-shim");
    // What a host that spawns through another library would do: spawn the shim, untracked by
    // itself, with the token on a pipe.
    let mut shim = host
        .exec_command(
            leash_binary(),
            cgroup.argv("sh", &["-c", "setsid sleep 600 & exec sleep 600"]),
        )
        .unwrap()
        .spawn()
        .unwrap();
    cgroup.settle(2, &["sleep"]);
    let registered = host
        .next_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("an event");
    assert_eq!(registered.kind, EventKind::Registered);
    assert_eq!(
        registered.pid,
        Some(shim.id()),
        "the shim registered itself, then exec'd"
    );
    let trees = host.list().unwrap();
    assert_eq!(trees.len(), 1);
    assert_eq!(
        trees[0].lease,
        host.lease().id,
        "the tree is under the host's lease"
    );
    assert_eq!(trees[0].members.len(), 2);

    drop(host);
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    eprintln!("host lease closed: shim-spawned tree empty after {emptied:?}");
    assert!(emptied.is_some(), "the tree outlived its host's lease");
    let _ = shim.wait();
}

#[test]
fn a_shim_with_a_bad_token_runs_nothing() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let marker = daemon.dir.join("ran");
    let output = daemon
        .leash()
        .args(["exec", "--", "touch"])
        .arg(&marker)
        .env("LEASH_LEASE", "0123456789abcdef0123456789abcdef")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no live lease has that token"));
    assert!(!marker.exists(), "the command must not run unregistered");
}

/// `leash exec` with the token source wrong in some way, run with `extra` args before `--`
/// and `token_env` as LEASH_LEASE; returns its exit code and stderr. The command it is given
/// would create a marker file, which must never exist.
fn exec_refused(extra: &[&str], token_env: Option<&str>) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("leash-exec-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _removed = leash_tests::Removed(dir.clone());
    let marker = dir.join(format!("ran-{}", extra.join("_")));
    let mut command = Command::new(leash_binary());
    command
        // No daemon there: every case must fail before it would connect.
        .args(["--socket", "/nonexistent/leash.sock", "exec"])
        .args(extra)
        .args(["--", "touch"])
        .arg(&marker)
        .env_remove("LEASH_LEASE");
    if let Some(token) = token_env {
        command.env("LEASH_LEASE", token);
    }
    let output = command.output().unwrap();
    assert!(!Path::new(&marker).exists(), "{extra:?}: the command ran");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_shim_takes_its_token_from_exactly_one_place_never_argv() {
    let token = "0123456789abcdef0123456789abcdef";
    let (code, stderr) = exec_refused(&[], None);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("no lease token"), "{stderr}");

    let (code, stderr) = exec_refused(&["--lease-fd", "2"], Some(token));
    assert_eq!(code, Some(125), "{stderr}");
    assert!(
        stderr.contains("both --lease-fd and LEASH_LEASE"),
        "{stderr}"
    );

    // The token on argv is not accepted at all (clap's usage error).
    let (code, stderr) = exec_refused(&["--lease", token], None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unexpected argument '--lease'"), "{stderr}");

    let (code, stderr) = exec_refused(&["--lease-fd", "1"], None);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("standard stream"), "{stderr}");

    let (code, stderr) = exec_refused(&["--lease-fd", "971"], None);
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("fd 971 is not open"), "{stderr}");

    let (code, stderr) = exec_refused(&[], Some(" "));
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("LEASH_LEASE is empty"), "{stderr}");
}

/// Runs `leash --socket SOCKET exec --lease-fd N --status-fd M EXTRA -- COMMAND` with `token` on a pipe, and
/// returns what the shim wrote on M (to its end: M closes as the command starts), its exit code
/// and its stderr.
fn exec_with_status(
    socket: &Path,
    token: &str,
    extra: &[&str],
    command: &[&str],
) -> (Vec<serde_json::Value>, Option<i32>, String) {
    use std::io::{Read, Write};
    let (token_reader, mut token_writer) = std::io::pipe().unwrap();
    writeln!(token_writer, "{token}").unwrap();
    drop(token_writer);
    let (mut status_reader, status_writer) = std::io::pipe().unwrap();
    let mut shim = Command::new(leash_binary());
    shim.arg("--socket").arg(socket);
    let lease_fd = leash_client::sys::pass_fd(&mut shim, token_reader.into()).unwrap();
    let status_fd = leash_client::sys::pass_fd(&mut shim, status_writer.into()).unwrap();
    shim.arg("exec")
        .args(["--lease-fd", &lease_fd.to_string()])
        .args(["--status-fd", &status_fd.to_string()])
        .args(extra)
        .arg("--")
        .args(command)
        .stderr(std::process::Stdio::piped());
    let child = shim.spawn().unwrap();
    // The parent's ends, held by `shim`'s pre-exec closures, close with it: the read below
    // ends when the shim's copy closes.
    drop(shim);
    let mut report = String::new();
    status_reader.read_to_string(&mut report).unwrap();
    let output = child.wait_with_output().unwrap();
    let lines = report
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (
        lines,
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_shim_reports_to_its_host_on_the_status_descriptor() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let host = daemon.client();
    let token = host.lease().token.clone();

    // Registered, then the command runs (its own argv[0] if asked): the report is one line.
    let (report, code, stderr) = exec_with_status(
        &daemon.socket,
        &token,
        &["--argv0", "renamed"],
        &["sh", "-c", r#"[ "$0" = renamed ]"#],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report.len(), 1, "{report:?}");
    assert!(
        report[0]["registered"]["tree"].as_u64().is_some(),
        "{report:?}"
    );
    assert!(
        report[0]["registered"]["root"].as_u64().is_some(),
        "{report:?}"
    );

    // Refused: the daemon's code and words, nothing on stderr, and no command.
    let marker = daemon.dir.join("ran");
    let marker_path = marker.to_str().unwrap();
    let (report, code, stderr) = exec_with_status(
        &daemon.socket,
        "0123456789abcdef0123456789abcdef",
        &[],
        &["touch", marker_path],
    );
    assert_eq!(code, Some(125));
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0]["error"]["code"], "not_found", "{report:?}");
    assert_eq!(
        report[0]["error"]["message"],
        "no live lease has that token"
    );
    assert_eq!(stderr, "", "the host reports the refusal, not the shim");
    assert!(!marker.exists(), "the command must not run unregistered");

    // Registered, but the command cannot be executed: errno as exec(2) gave it, the words
    // and the exit status a shell would give (127: not found; 126: found, not executable).
    for (command, status, errno, message) in [
        (
            "/nonexistent/agent",
            127,
            libc::ENOENT,
            "/nonexistent/agent: No such file or directory",
        ),
        (
            "leash-no-such-agent",
            127,
            libc::ENOENT,
            "leash-no-such-agent: command not found",
        ),
        ("/", 126, libc::EACCES, "/: Is a directory"),
    ] {
        let (report, code, stderr) = exec_with_status(&daemon.socket, &token, &[], &[command]);
        assert_eq!(code, Some(status), "{command}: {stderr}");
        assert_eq!(report.len(), 2, "{report:?}");
        assert!(report[0].get("registered").is_some(), "{report:?}");
        assert_eq!(report[1]["exec_failed"]["errno"], errno, "{report:?}");
        assert_eq!(report[1]["exec_failed"]["message"], message, "{report:?}");
        assert_eq!(stderr, "", "the host reports it, not the shim");
    }
}

#[test]
fn a_shim_says_when_there_is_no_daemon() {
    let dir = std::env::temp_dir().join(format!("leash-no-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _removed = leash_tests::Removed(dir.clone());
    let (report, code, stderr) = exec_with_status(
        &dir.join("leash.sock"),
        "0123456789abcdef0123456789abcdef",
        &[],
        &["true"],
    );
    assert_eq!(code, Some(125));
    assert_eq!(stderr, "");
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0]["error"]["code"], "unavailable", "{report:?}");
    let message = report[0]["error"]["message"].as_str().unwrap();
    assert!(message.contains("is `leash daemon` running?"), "{message}");
}
