//! `leash doctor --json`: each situation gives the right finding, and the exit status says
//! whether the daemon can run here and answers (0) or not (1). The assertions read the findings'
//! statuses and fixes as JSON, never the prose of the text output.

use std::{
    fs,
    io::Read,
    os::unix::fs::{PermissionsExt, chown},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use leash_common::program;
use leash_tests::{
    Removed,
    daemon::{Daemon, path_str, setpriv_args},
    leash_binary, wait_for,
};
use serde_json::Value;

/// Someone other than root: no passwd entry is needed.
const USER: u32 = 61001;

/// A child killed and reaped however the test ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one `leash doctor --json` run said.
struct Doctor {
    code: i32,
    report: Value,
    stderr: String,
}

impl Doctor {
    /// Runs `command` (which ends with `doctor --json`), a minute at most: every check doctor
    /// makes is bounded, so a run that takes longer is a failure.
    fn run(mut command: Command) -> Self {
        let mut child = Reaped(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("starting leash doctor"),
        );
        let mut stdout = child.0.stdout.take().unwrap();
        let mut stderr = child.0.stderr.take().unwrap();
        let out = thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let err = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut status = None;
        let done = wait_for(Duration::from_secs(60), || {
            status = child.0.try_wait().ok().flatten();
            status.is_some()
        });
        assert!(done, "leash doctor did not finish within a minute");
        let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
        let report = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("doctor --json: {e}\nstdout:\n{stdout}\nstderr:\n{stderr}"));
        Self {
            code: status.unwrap().code().expect("doctor exited, not killed"),
            report,
            stderr,
        }
    }

    fn finding(&self, name: &str) -> &Value {
        self.report["findings"]
            .as_array()
            .expect("a findings array")
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no finding {name} in {:#}", self.report))
    }

    fn status(&self, name: &str) -> &str {
        self.finding(name)["status"].as_str().expect("a status")
    }

    fn fix(&self, name: &str) -> &str {
        self.finding(name)["fix"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no fix: {:#}", self.report))
    }

    fn statuses(&self) -> Vec<(String, String)> {
        self.report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["name"].to_string(), f["status"].to_string()))
            .collect()
    }
}

/// `leash --socket SOCKET doctor --json ARGS...`.
fn doctor(socket: &str, args: &[&str]) -> Command {
    let mut command = Command::new(leash_binary());
    command
        .args(["--socket", socket, "doctor", "--json"])
        .args(args);
    command
}

/// A directory of the test's own under /tmp, `mode`, owned by `uid`.
fn scratch_dir(label: &str, mode: u32, uid: u32) -> Removed {
    let path = PathBuf::from(format!("/tmp/leash-doctor-{}-{label}", std::process::id()));
    let _ = fs::remove_dir_all(&path);
    let dir = Removed(path);
    fs::create_dir(&dir.0).unwrap();
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(mode)).unwrap();
    chown(&dir.0, Some(uid), Some(uid)).unwrap();
    dir
}

/// Whether a BPF program named `name` is loaded (in any process, or pinned, or attached).
fn program_loaded(name: &str) -> bool {
    aya::programs::loaded_programs()
        .flatten()
        .any(|program| program.name_as_str() == Some(name))
}

/// Whether the daemon's guard is the fallback tracepoints (which leave /proc/PID/mem open),
/// from the programs its status lists.
fn guard_is_the_fallback(daemon: &Daemon) -> bool {
    let programs = daemon.client().status().unwrap().programs;
    let listed = |name: &str| programs.iter().any(|p| p.split(' ').next() == Some(name));
    listed(program::PTRACE_ATTACH_TP)
        && ![
            program::PTRACE_GUARD_LSM,
            program::PTRACE_GUARD,
            program::PTRACE_GUARD_KPROBE,
        ]
        .into_iter()
        .any(listed)
}

#[test]
fn with_the_daemon_running_every_finding_is_ok() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let pins = path_str(&daemon.pins).to_owned();
    let run = Doctor::run(doctor(path_str(&daemon.socket), &["--pin-dir", &pins]));
    // But the guard, where the kernel takes only the fallback: a warning of its own.
    let fallback = guard_is_the_fallback(&daemon);
    assert_eq!(
        run.status("ptrace_guard"),
        if fallback { "warn" } else { "ok" },
        "{:#}",
        run.report
    );
    // And TIOCSTI, where any process may use it (this kernel is 6.2 or later).
    let tiocsti = fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
        .ok()
        .map(|value| if value.trim() == "0" { "ok" } else { "warn" });
    if let Some(tiocsti) = tiocsti {
        assert_eq!(run.status("legacy_tiocsti"), tiocsti, "{:#}", run.report);
    }
    let not_ok: Vec<_> = run
        .statuses()
        .into_iter()
        .filter(|(name, status)| {
            status != "\"ok\"" && name != "\"ptrace_guard\"" && name != "\"legacy_tiocsti\""
        })
        .collect();
    assert!(not_ok.is_empty(), "not ok: {not_ok:?} in {:#}", run.report);
    let warned = fallback || tiocsti == Some("warn");
    assert_eq!(run.report["verdict"], if warned { "warn" } else { "ok" });
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.report["daemon_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(run.report["version"], env!("CARGO_PKG_VERSION"));
    // The order of the checks.
    let names: Vec<String> = run.statuses().into_iter().map(|(name, _)| name).collect();
    let at = |name: &str| {
        names
            .iter()
            .position(|n| n == &format!("\"{name}\""))
            .unwrap()
    };
    assert!(at("kernel") < at("bpf_syscall") && at("bpf_syscall") < at("tp_btf"));
    assert!(at("tp_btf") < at("bpffs") && at("bpffs") < at("socket_dir"));
    assert!(at("socket_dir") < at("pid_namespace") && at("pid_namespace") < at("daemon"));
    assert!(at("daemon") < at("membership") && at("membership") < at("ptrace_guard"));
    assert!(at("ptrace_guard") < at("pins"));
    // The tp_btf probe loaded and attached a program: it is gone with doctor (nothing pinned,
    // no link left).
    assert!(
        wait_for(Duration::from_secs(10), || !program_loaded("leash_probe")),
        "doctor's probe program is still loaded"
    );
}

#[test]
fn with_the_daemon_stopped_the_daemon_fails_and_says_how_to_start_it() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    assert!(daemon.stop(), "the daemon stops cleanly");
    let pins = path_str(&daemon.pins).to_owned();
    let run = Doctor::run(doctor(path_str(&daemon.socket), &["--pin-dir", &pins]));
    assert_eq!(run.status("daemon"), "fail");
    let fix = run.fix("daemon");
    assert!(fix.contains("systemctl start leash"), "{fix}");
    assert!(fix.contains("leash daemon --socket"), "{fix}");
    assert_eq!(run.report["verdict"], "fail");
    assert!(run.report["daemon_version"].is_null());
    assert_eq!(run.code, 1);
    // What does not depend on the daemon is as it was.
    for name in ["bpffs", "socket_dir", "pid_namespace", "pins"] {
        assert_eq!(run.status(name), "ok", "{name} in {:#}", run.report);
    }
}

#[test]
fn a_wrong_socket_path_fails_the_daemon_check() {
    let socket = format!(
        "/nonexistent/leash-doctor-{}/leash.sock",
        std::process::id()
    );
    let run = Doctor::run(doctor(&socket, &[]));
    assert_eq!(run.status("daemon"), "fail");
    let message = run.finding("daemon")["message"].as_str().unwrap();
    assert!(message.contains(&socket), "{message}");
    assert!(run.fix("daemon").contains("--socket"));
    // Nothing is there, and the daemon would make it under root's /.
    assert_eq!(run.status("socket_dir"), "ok");
    assert!(
        !PathBuf::from(&socket).parent().unwrap().exists(),
        "doctor makes nothing"
    );
    assert_eq!(run.report["socket"], socket);
    assert_eq!(run.code, 1);
}

#[test]
fn without_bpffs_the_bpffs_check_fails_and_names_the_mount() {
    let socket = format!(
        "/nonexistent/leash-doctor-{}/leash.sock",
        std::process::id()
    );
    // A private mount namespace of its own, gone with the command: /sys/fs/bpf unmounted there
    // (every mount stacked on it), then doctor.
    let mut command = Command::new("unshare");
    command.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"while umount /sys/fs/bpf 2>/dev/null; do :; done; exec "$0" --socket "$1" doctor --json"#,
        path_str(&leash_binary()),
        &socket,
    ]);
    let run = Doctor::run(command);
    assert_eq!(run.status("bpffs"), "fail", "{:#}", run.report);
    assert!(
        run.fix("bpffs")
            .contains("mount -t bpf -o mode=0700 bpf /sys/fs/bpf"),
        "{}",
        run.fix("bpffs")
    );
    assert_eq!(run.code, 1);
}

#[test]
fn a_socket_directory_others_may_write_or_own_fails() {
    for (label, mode, uid, fix) in [
        ("open", 0o777, 0, "chmod go-w"),
        ("theirs", 0o755, USER, "chown root"),
    ] {
        let dir = scratch_dir(label, mode, uid);
        let socket = dir.0.join("leash.sock");
        let run = Doctor::run(doctor(path_str(&socket), &[]));
        assert_eq!(
            run.status("socket_dir"),
            "fail",
            "{label}: {:#}",
            run.report
        );
        let message = run.finding("socket_dir")["message"].as_str().unwrap();
        assert!(message.contains(path_str(&dir.0)), "{label}: {message}");
        assert!(
            run.fix("socket_dir").contains(fix),
            "{label}: {}",
            run.fix("socket_dir")
        );
        assert_eq!(run.code, 1);
    }
}

#[test]
fn an_ordinary_user_is_told_what_needs_root() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let leash = daemon.leash_for_anyone();
    let mut command = Command::new("setpriv");
    command
        .args(setpriv_args(USER))
        .arg(&leash)
        .args(["--socket", path_str(&daemon.socket), "doctor", "--json"])
        .current_dir("/");
    let run = Doctor::run(command);
    for name in [
        "bpf_syscall",
        "tp_btf",
        "ring_buffer",
        "helper_ktime_get_boot_ns",
        "helper_probe_read_kernel",
        "helper_send_signal",
        "pins",
    ] {
        assert_eq!(run.status(name), "needs_root", "{name}: {:#}", run.report);
    }
    // What any user can check, checked.
    for name in [
        "kernel",
        "btf",
        "bpffs",
        "socket_dir",
        "pid_namespace",
        "daemon",
    ] {
        assert_eq!(run.status(name), "ok", "{name}: {:#}", run.report);
    }
    assert_eq!(run.report["daemon_version"], env!("CARGO_PKG_VERSION"));
    assert!(
        run.report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["status"] != "fail"),
        "{:#}",
        run.report
    );
    // Reached, and nothing fails: the rest needs root to tell.
    assert_eq!(run.report["verdict"], "warn");
    assert_eq!(run.code, 0, "{}", run.stderr);
    let text = run.report.to_string() + &run.stderr;
    assert!(
        !text.contains("os error") && !text.contains("EPERM") && !text.contains("not permitted"),
        "no raw error: {text}"
    );
}

#[test]
fn a_socket_that_never_answers_fails_the_daemon_check_in_bounded_time() {
    let dir = scratch_dir("silent", 0o755, 0);
    let socket = dir.0.join("leash.sock");
    // Connections queue on it, and nothing ever answers them.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let started = std::time::Instant::now();
    let run = Doctor::run(doctor(path_str(&socket), &[]));
    assert_eq!(run.status("daemon"), "fail", "{:#}", run.report);
    assert!(run.report["daemon_version"].is_null());
    assert_eq!(run.code, 1);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "doctor gave up on the silent socket after {:?}",
        started.elapsed()
    );
}

/// The guard the daemon has in place, as its status lists it: the fallback tracepoints leave
/// /proc/PID/mem open, and no guard leaves everything open; either is a warning, with a fix,
/// and neither fails the verdict.
#[test]
fn a_guard_that_leaves_proc_mem_open_warns() {
    for (choice, fix) in [("tracepoints", "journalctl"), ("off", "--ptrace-guard off")] {
        let Some(daemon) = Daemon::start(&["--ptrace-guard", choice]) else {
            return;
        };
        let pins = path_str(&daemon.pins).to_owned();
        let run = Doctor::run(doctor(path_str(&daemon.socket), &["--pin-dir", &pins]));
        assert_eq!(
            run.status("ptrace_guard"),
            "warn",
            "{choice}: {:#}",
            run.report
        );
        assert!(
            run.fix("ptrace_guard").contains(fix),
            "{choice}: {:#}",
            run.report
        );
        assert_eq!(run.report["verdict"], "warn", "{choice}: {:#}", run.report);
        assert_eq!(run.code, 0, "{choice}: {}", run.stderr);
    }
}
