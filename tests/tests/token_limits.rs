//! A lease's token lets another process register under that lease, but it does not lend the
//! lease's uid: what uid 61002 registers with a root host's token counts against 61002's own
//! tree limit, so one user cannot take the daemon's whole capacity through a token.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, setpriv_args},
};
use serde_json::Value;

/// argv: SOCKET TOKEN COUNT. Starts COUNT sleeps of its own and registers each under the token's
/// lease; prints each reply.
const REGISTER: &str = r#"
import json, socket, subprocess, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
for i in range(int(sys.argv[3])):
    child = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)
    f.write(json.dumps({"id": i, "op": "register", "pid": child.pid, "lease": sys.argv[2]}) + "\n")
    f.flush()
    print(f.readline().strip(), flush=True)
"#;

#[test]
fn trees_registered_with_a_token_count_against_the_requester() {
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", "2"]) else {
        return;
    };
    // A host running as root: its trees are uid 0's, which has no limit.
    let root_host = daemon.client();
    let token = root_host.lease().token.clone();
    // In a cgroup of its own, which ends whatever it leaves (the unregistered third sleep).
    let cgroup = Cgroup::new("token-limits");
    let mut args = setpriv_args(USER_B);
    args.extend(
        [
            "/usr/bin/python3",
            "-c",
            REGISTER,
            path_str(&daemon.socket),
            &token,
            "3",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = cgroup
        .command("setpriv", &args)
        .current_dir("/")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let replies: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    eprintln!("replies: {replies:?}");
    assert_eq!(replies.len(), 3, "one reply per registration");
    assert!(replies[0]["ok"].is_object() && replies[1]["ok"].is_object());
    assert_eq!(
        replies[2]["error"]["code"], "limit_reached",
        "a third tree is over uid {USER_B}'s limit, whoever's token it used"
    );
    drop(root_host);
}

/// argv: SOCKET. Opens a lease, prints its token, and holds the lease until stdin ends.
const HOST: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.write(json.dumps({"id": 1, "op": "hello", "protocol": 1}) + "\n")
f.flush()
print(json.loads(f.readline())["ok"]["hello"]["lease"]["token"], flush=True)
sys.stdin.read()
"#;

/// Uid 61002 registers its own process under uid 61001's lease: 61002 may signal it, but the
/// lease's owner, who would hold the tree, may not. The refusal names 61001, whose right
/// failed; before, it said that 61002 may not signal its own process.
#[test]
fn a_refusal_names_the_uid_whose_right_failed() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("token-refusal");
    let mut args = setpriv_args(USER_A);
    args.extend(["/usr/bin/python3", "-c", HOST, path_str(&daemon.socket)].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut host = cgroup
        .command("setpriv", &args)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut token = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut token)
        .unwrap();
    let token = token.trim();
    assert_eq!(
        token.len(),
        32,
        "a token from uid {USER_A}'s host: {token:?}"
    );

    let mut args = setpriv_args(USER_B);
    args.extend(
        [
            "/usr/bin/python3",
            "-c",
            REGISTER,
            path_str(&daemon.socket),
            token,
            "1",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = cgroup
        .command("setpriv", &args)
        .current_dir("/")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reply["error"]["code"], "permission_denied", "{reply}");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "belongs to uid {USER_B}; uid {USER_A}, which holds the lease"
        )),
        "{message}"
    );
    drop(host.stdin.take());
    let _ = host.wait();
}
