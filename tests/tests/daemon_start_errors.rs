//! A daemon that cannot start says so at once, with the fix that works for the setup it was
//! given: run as another user than root, it says to run it as root (not that it cannot make
//! /run/leash); a socket straight in /tmp, that it needs a directory of its own and the exact
//! command to make one (not to take /tmp from every user with chown and chmod); a relative
//! socket path, that it needs an absolute one. Nothing is bound, pinned or loaded.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use leash_tests::{
    Removed,
    daemon::{USER_A, leash_for_anyone_in, path_str, setpriv_args},
    leash_binary, wait_for,
};

/// How long a refused start may take: it fails before it loads anything.
const QUICK: Duration = Duration::from_secs(10);

/// Runs `command` (a `leash daemon` that must fail), killing it if it runs past [`QUICK`];
/// returns its output and how long it took.
fn refused_start(mut command: Command) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = command
        .env("LEASH_LOG", "info")
        .env_remove("LEASH_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_for(QUICK, || child.try_wait().ok().flatten().is_some());
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    assert!(exited, "the daemon still ran after {QUICK:?}: {output:?}");
    assert!(
        !output.status.success(),
        "it exits with failure: {output:?}"
    );
    (output, started.elapsed())
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A directory of this test's own, root's, 0755 (other users may enter it).
fn scratch(label: &str) -> Removed {
    let dir = PathBuf::from(format!(
        "/tmp/leash-start-errors-{}-{label}",
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    Removed(dir)
}

/// `leash daemon --no-pin --socket SOCKET`, from `leash`.
fn daemon_command(leash: &Path, socket: &str) -> Command {
    let mut command = Command::new(leash);
    command.args(["daemon", "--no-pin", "--socket", socket]);
    command
}

#[test]
fn a_daemon_run_as_another_user_says_to_run_it_as_root() {
    let dir = scratch("user");
    // The build tree may be out of this user's reach: a copy in the scratch directory is not.
    let leash = leash_for_anyone_in(&dir.0);
    let socket = dir.0.join("run/leash.sock");
    let mut command = Command::new("setpriv");
    command.args(setpriv_args(USER_A)).arg(&leash).args([
        "daemon",
        "--no-pin",
        "--socket",
        path_str(&socket),
    ]);
    let (output, took) = refused_start(command);
    let said = stderr(&output);
    eprintln!("as uid {USER_A}, after {took:?}: {said}");
    assert!(said.contains("runs as root"), "{said}");
    assert!(said.contains(&format!("not as uid {USER_A}")), "{said}");
    assert!(said.contains("sudo leash daemon"), "{said}");
    assert!(!said.contains("Permission denied"), "{said}");
    assert!(!dir.0.join("run").exists(), "nothing was made");
}

#[test]
fn a_socket_in_tmp_gets_a_directory_of_its_own() {
    let name = format!("start-errors-{}.sock", std::process::id());
    let socket = format!("/tmp/{name}");
    let (output, took) = refused_start(daemon_command(&leash_binary(), &socket));
    let said = stderr(&output);
    eprintln!("--socket {socket}, after {took:?}: {said}");
    let stem = name.trim_end_matches(".sock");
    let own = format!("/tmp/leash-{stem}");
    assert!(said.contains(&format!("mkdir -m 0755 {own}")), "{said}");
    assert!(
        said.contains(&format!("--socket {own}/leash.sock")),
        "{said}"
    );
    assert!(
        !said.contains("chmod go-w") && !said.contains("chown root"),
        "never the advice that takes /tmp from every user: {said}"
    );
    assert!(!Path::new(&socket).exists(), "no socket was bound");
    assert!(!Path::new(&own).exists(), "nothing was made");
}

#[test]
fn a_relative_socket_path_is_refused() {
    let dir = scratch("relative");
    let mut command = daemon_command(&leash_binary(), "leash.sock");
    command.current_dir(&dir.0);
    let (output, took) = refused_start(command);
    let said = stderr(&output);
    eprintln!("--socket leash.sock, after {took:?}: {said}");
    assert!(said.contains("relative path"), "{said}");
    assert!(
        said.contains(&format!("--socket {}/leash.sock", dir.0.display())),
        "it names the absolute path: {said}"
    );
    assert!(!dir.0.join("leash.sock").exists(), "no socket was bound");
}
