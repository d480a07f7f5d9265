//! A lease's token lets another process register under that lease, but it does not lend the
//! lease's uid: what uid 61002 registers with a root host's token counts against 61002's own
//! tree limit, so one user cannot take the daemon's whole capacity through a token.

use std::process::Stdio;

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_B, path_str, setpriv_args},
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
