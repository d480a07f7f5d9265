//! As an unprivileged user: leashing its own command works; registering a root-owned process
//! and killing another host's tree are refused.

use std::{fs, os::unix::fs::PermissionsExt, process::Stdio};

use leash_client::TreeOptions;
use leash_tests::{
    Cgroup,
    daemon::{Daemon, LeashedTree, alive, as_nobody, path_str},
};

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
    // Any language can speak the protocol: here, the system Python as nobody, naming the
    // process by its pid, then by a pidfd (which anyone may open for any process).
    let speak = r#"
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
pid, named_by = int(sys.argv[2]), sys.argv[3]
if named_by == "pid":
    f.write(json.dumps({"id": 1, "op": "register", "pid": pid}) + "\n")
    f.flush()
else:
    line = (json.dumps({"id": 1, "op": "register", "pidfd": True}) + "\n").encode()
    sent = socket.send_fds(s, [line], [os.pidfd_open(pid)])
    s.sendall(line[sent:])
print(f.readline().strip())
"#;
    for named_by in ["pid", "pidfd"] {
        let output = as_nobody("/usr/bin/python3")
            .args([
                "-c",
                speak,
                path_str(&daemon.socket),
                &roots.id().to_string(),
                named_by,
            ])
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let reply = String::from_utf8_lossy(&output.stdout);
        eprintln!("nobody registering root's process by its {named_by}: {reply}");
        let reply: serde_json::Value = serde_json::from_str(&reply).expect("a JSON reply");
        assert_eq!(reply["id"], 1);
        assert_eq!(
            reply["error"]["code"], "permission_denied",
            "by its {named_by}"
        );
        assert!(
            daemon.client().list().unwrap().is_empty(),
            "nothing was registered"
        );
    }
    let _ = roots.kill();
    let _ = roots.wait();
}

#[test]
fn a_user_may_not_kill_another_hosts_tree() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let roots = LeashedTree::spawn(
        &mut host,
        "not-yours",
        "sleep",
        &["600"],
        &TreeOptions::default(),
    );
    let tree = roots.tree;
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
    assert!(alive(roots.root.id()), "root's tree must live on");
    assert!(host.list().unwrap().iter().any(|t| t.tree == tree));
}

#[test]
fn a_user_may_hold_only_so_many_trees() {
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", "2"]) else {
        return;
    };
    // nobody starts three processes of its own and registers each on one connection.
    let speak = r#"
import json, socket, subprocess, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
sleeps = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
for i, p in enumerate(sleeps):
    f.write(json.dumps({"id": i, "op": "register", "pid": p.pid}) + "\n")
    f.flush()
    print(f.readline().strip())
for p in sleeps:
    p.kill()
"#;
    let output = as_nobody("/usr/bin/python3")
        .args(["-c", speak, path_str(&daemon.socket)])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let replies: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON reply"))
        .collect();
    eprintln!("nobody registering 3 trees with a limit of 2: {replies:?}");
    assert_eq!(replies.len(), 3);
    assert!(replies[0]["ok"]["registered"].is_object());
    assert!(replies[1]["ok"]["registered"].is_object());
    assert_eq!(replies[2]["error"]["code"], "limit_reached");
}
