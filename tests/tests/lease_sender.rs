//! A lease is its host's. The kernel names the sender of every request on a lease's connection
//! (SO_PASSCRED), and a request sent by any other process is refused while the lease goes on:
//! a child that inherited the host's socket, or an agent that took it, cannot release the
//! host's tree. As uid 61001, the host registers a tree, forks, and its child sends `release`
//! on the host's socket: refused, with no reply (its id is not one the host sent) but a
//! `refused` event that names the child and quotes its line; the host's own requests are
//! served; and when the host is SIGKILLed, its tree dies with it.

use std::{fs, time::Duration};

use leash_tests::{
    Cgroup, Removed,
    daemon::{Daemon, USER_A, path_str, setpriv_args},
    wait_for,
};
use serde_json::Value;

/// The host: argv is SOCKET OUT. It writes down every line the daemon sent it.
const HOST: &str = r#"
import json, os, socket, subprocess, sys, time
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.settimeout(20)
f = s.makefile("rw")
r = {"lines": []}
def send(sock, line):
    sock.sendall((line + "\n").encode())
def line():
    got = json.loads(f.readline())
    r["lines"].append(got)
    return got
def reply():
    while True:
        got = line()
        if "event" not in got:
            return got
tool = subprocess.Popen(["sleep", "600"])
send(s, json.dumps({"id": 1, "op": "register", "pid": tool.pid}))
r["register"] = reply()
tree = r["register"]["ok"]["registered"]["tree"]
# A process that forked from the host, with the lease's socket.
r["child_line"] = json.dumps({"id": 2, "op": "release", "tree": tree})
child = os.fork()
if child == 0:
    send(s, r["child_line"])
    os._exit(0)
os.waitpid(child, 0)
r["child"] = child
while True:
    event = line().get("event", {})
    if event.get("kind") == "refused":
        r["refused"] = event
        break
send(s, json.dumps({"id": 3, "op": "list"}))
r["list_by_host"] = reply()
with open(out + ".part", "w") as file:
    json.dump(r, file)
os.rename(out + ".part", out)
time.sleep(600)
"#;

#[test]
fn a_request_the_host_did_not_send_is_refused_and_the_lease_stays() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let out = Removed(daemon.dir.join("host-results.json"));
    fs::set_permissions(
        &daemon.dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let cgroup = Cgroup::new("lease-sender");
    let mut argv = setpriv_args(USER_A);
    argv.extend(["/usr/bin/python3", "-c", HOST].map(String::from));
    argv.extend([path_str(&daemon.socket), path_str(&out.0)].map(String::from));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut host = cgroup.command("setpriv", &argv).spawn().unwrap();
    assert!(
        wait_for(Duration::from_secs(30), || out.0.exists()),
        "the host did not report; daemon log:\n{}",
        daemon.log()
    );
    let results: Value = serde_json::from_str(&fs::read_to_string(&out.0).unwrap()).unwrap();
    eprintln!("what the host got: {results:#}");
    let tree = &results["register"]["ok"]["registered"]["tree"];
    assert!(tree.is_u64(), "{}", results["register"]);
    // The host is told who sent what, and nothing answers the child's id.
    let refused = &results["refused"];
    assert_eq!(refused["code"], "permission_denied", "{results:#}");
    assert_eq!(refused["pid"], results["child"], "the child sent it");
    assert_eq!(refused["line"], results["child_line"], "{refused}");
    assert_eq!(refused["tree"], 0, "{refused}");
    assert!(refused["lease"].as_u64().is_some_and(|lease| lease > 0));
    let lines = results["lines"].as_array().unwrap();
    assert!(
        lines.iter().all(|line| line["id"] != 2),
        "no reply carries the child's id: {lines:?}"
    );
    let listed = results["list_by_host"]["ok"]["trees"].as_array().unwrap();
    assert!(
        listed.iter().any(|t| &t["tree"] == tree),
        "the host is still served, and its tree is still held: {listed:?}"
    );

    host.kill().unwrap();
    let _ = host.wait();
    assert!(
        cgroup.wait_empty(Duration::from_secs(10)).is_some(),
        "the tree dies with its host: {:?}",
        cgroup.procs()
    );
}
