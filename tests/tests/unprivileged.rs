//! As an unprivileged user: leashing its own command works; registering a root-owned process
//! and killing another host's tree are refused.

use std::{
    fs,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    process::{Command, Stdio},
};

use leash_client::TreeOptions;
use leash_tests::{
    Cgroup,
    daemon::{Daemon, alive, path_str},
};

const NOBODY: u32 = 65534;

/// A command run as nobody.
fn as_nobody(program: &str) -> Command {
    let mut command = Command::new(program);
    command.uid(NOBODY).gid(NOBODY).env_remove("LEASH_SOCKET");
    command
}

#[test]
fn a_user_leashes_its_own_command() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let work = daemon.dir.join("work");
    fs::create_dir(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o777)).unwrap();
    let pid_file = work.join("orphan.pid");
    let leash = daemon.leash_for_anyone();
    let script = format!(
        "setsid sleep 600 & echo $! > {}; exit 7",
        path_str(&pid_file)
    );
    let output = as_nobody(path_str(&leash))
        .args([
            "--socket",
            path_str(&daemon.socket),
            "run",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(7),
        "leash run returns the command's status: {stderr}"
    );
    let orphan: u32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !alive(orphan),
        "the orphan the command left behind was killed"
    );
}

#[test]
fn a_user_may_not_register_roots_process() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("roots-process");
    let mut roots = cgroup.command("sleep", &["600"]).spawn().unwrap();
    cgroup.settle(1, &["sleep"]);
    // Any language can speak the protocol: here, the system Python as nobody.
    let speak = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.write(json.dumps({"id": 1, "op": "register", "pid": int(sys.argv[2])}) + "\n")
f.flush()
print(f.readline().strip())
"#;
    let output = as_nobody("/usr/bin/python3")
        .args([
            "-c",
            speak,
            path_str(&daemon.socket),
            &roots.id().to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let reply = String::from_utf8_lossy(&output.stdout);
    eprintln!("nobody registering root's process: {reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).expect("a JSON reply");
    assert_eq!(reply["id"], 1);
    assert_eq!(reply["error"]["code"], "permission_denied");
    assert!(
        daemon.client().list().unwrap().is_empty(),
        "nothing was registered"
    );
    let _ = roots.kill();
    let _ = roots.wait();
}

#[test]
fn a_user_may_not_kill_another_hosts_tree() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let cgroup = Cgroup::new("not-yours");
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sleep", &["600"]),
            &TreeOptions::default(),
        )
        .unwrap();
    let leash = daemon.leash_for_anyone();
    let output = as_nobody(path_str(&leash))
        .args([
            "--socket",
            path_str(&daemon.socket),
            "kill",
            &tree.to_string(),
            "--grace",
            "0",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("nobody killing root's tree {tree}: {stderr}");
    assert!(!output.status.success());
    assert!(stderr.contains(&format!("no tree {tree}")), "{stderr}");
    assert!(alive(root.id()), "root's tree must live on");
    assert!(host.list().unwrap().iter().any(|t| t.tree == tree));
    let _ = root.kill();
    let _ = root.wait();
}
