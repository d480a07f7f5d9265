//! When the daemon refuses to register a command (a per-uid tree limit, a full capacity), the
//! command never runs, the client says why at once, and nothing is left running or waiting: the
//! child that was held before exec gives up and is reaped. Before, it waited for ever on a pipe
//! whose write end it held itself, and `leash run` with it.

use std::{
    fs,
    io::{Read, Write},
    os::unix::{fs::PermissionsExt, process::CommandExt},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use leash_client::{Error, ErrorCode, TreeOptions};
use leash_tests::{
    Cgroup,
    daemon::{Daemon, path_str},
    wait_for,
};

/// A uid with no passwd entry: the daemon needs none.
const UID: u32 = 61001;

/// Starts `argv` as UID inside `cgroup`. It waits (as a shell reading stdin) until the test, as
/// root, has moved it into the group, which the user itself may not do; then it execs.
fn spawn_in(cgroup: &Cgroup, argv: &[String], stderr: Stdio) -> Child {
    let mut child = Command::new("sh")
        .args(["-c", r#"read go && exec "$@""#, "sh"])
        .args(argv)
        .uid(UID)
        .gid(UID)
        .env_remove("LEASH_SOCKET")
        .env_remove("LEASH_LEASE")
        .stdin(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    fs::write(cgroup.procs_file(), child.id().to_string()).unwrap();
    let mut gate = child.stdin.take().unwrap();
    gate.write_all(b"go\n").unwrap();
    child
}

#[test]
fn a_refused_leash_run_says_why_and_leaves_nothing_running() {
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", "1"]) else {
        return;
    };
    let leash = daemon.leash_for_anyone();
    let work = daemon.dir.join("work");
    fs::create_dir(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777)).unwrap();
    let marker = work.join("ran");
    // Whatever happens, dropping the group kills every process of this test's.
    let cgroup = Cgroup::new("run-refused");
    let run = |command: &[&str]| -> Vec<String> {
        [
            path_str(&leash),
            "--socket",
            path_str(&daemon.socket),
            "run",
            "--",
        ]
        .iter()
        .chain(command)
        .map(|arg| arg.to_string())
        .collect()
    };

    // The uid's one tree.
    let mut first = spawn_in(&cgroup, &run(&["sleep", "600"]), Stdio::inherit());
    cgroup.settle_exactly(&["leash", "sleep"]);
    assert_eq!(daemon.client().list().unwrap().len(), 1);

    let touch = format!("touch {}", path_str(&marker));
    let mut second = spawn_in(&cgroup, &run(&["sh", "-c", &touch]), Stdio::piped());
    let mut stderr = second.stderr.take().unwrap();
    let mut refused = None;
    let ended = wait_for(Duration::from_secs(30), || {
        refused = second.try_wait().unwrap();
        refused.is_some()
    });
    if !ended {
        let _ = second.kill();
        let _ = second.wait();
        panic!("leash run hangs when its registration is refused");
    }
    let mut said = String::new();
    stderr.read_to_string(&mut said).unwrap();
    eprintln!("the refused leash run said: {said}");
    assert_eq!(refused.unwrap().code(), Some(125), "{said}");
    assert!(
        said.contains(&format!(
            "leash: the leash daemon refused: uid {UID} holds 1 trees, the most allowed \
             (limit_reached)"
        )),
        "{said}"
    );
    assert!(!marker.exists(), "the refused command ran");
    // Only the first tree is left: its leash run and its sleep.
    cgroup.settle_exactly(&["leash", "sleep"]);
    assert_eq!(daemon.client().list().unwrap().len(), 1);

    let _ = first.kill();
    let _ = first.wait();
}

/// The same from the Rust library: `spawn` returns the daemon's error, promptly.
#[test]
fn a_refused_spawn_returns_the_daemons_error() {
    let Some(daemon) = Daemon::start(&["--max-trees", "1"]) else {
        return;
    };
    let mut host = daemon.client();
    let cgroup = Cgroup::new("spawn-refused");
    let (_tree, mut first) = host
        .spawn(
            &mut cgroup.command("sleep", &["600"]),
            &TreeOptions::default(),
        )
        .unwrap();
    cgroup.settle(1, &["sleep"]);

    let marker = daemon.dir.join("ran");
    let (done, returned) = mpsc::channel();
    let mut touch = cgroup.command("touch", &[path_str(&marker)]);
    thread::spawn(move || {
        let result = host.spawn(&mut touch, &TreeOptions::default());
        // The host comes back too: its lease holds the first tree.
        let _ = done.send((result.map(|(_, child)| child), host));
    });
    // If it hangs, the held child hangs before it joins the group: the test's end kills it.
    let (result, _host) = returned
        .recv_timeout(Duration::from_secs(30))
        .expect("spawn returns when the registration is refused");
    match result {
        Err(Error::Daemon { code, message }) => {
            assert_eq!(code, ErrorCode::LimitReached);
            assert_eq!(message, "the daemon's tree capacity is full");
        }
        Err(other) => panic!("not the daemon's error: {other}"),
        Ok(mut child) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("a command over capacity was started");
        }
    }
    assert!(!marker.exists(), "the refused command ran");
    cgroup.settle(1, &["sleep"]);
    let _ = first.kill();
    let _ = first.wait();
}
