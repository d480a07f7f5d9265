//! A container's root cannot speak for its host. In a rootless container (its own user and pid
//! namespaces, made with `unshare` as uid 61001), root has CAP_SYS_ADMIN over the user namespace
//! that owns its pid namespace, and the kernel then lets it name any pid of that namespace in
//! SCM_CREDENTIALS: the sender the daemon is told of is whatever it claims. Here the host
//! registers its agent, root of the container, and leaks its lease's socket to it. The agent
//! sends `release` of its own tree twice: under its own pid (refused as a stranger's line), then
//! naming the host's pid. The second must be refused too, and the tree still held.

use std::{fs, os::unix::fs::PermissionsExt, process::Stdio, time::Duration};

use leash_tests::{Cgroup, Removed, container::Container, daemon::Daemon, wait_for};
use serde_json::Value;

/// The agent: argv is FD HOST_PID; its tree comes on stdin. It sends line 2 as itself, then
/// line 3 with credentials that name the host.
const AGENT: &str = r#"
import json, os, socket, struct, sys, time
s = socket.socket(fileno=int(sys.argv[1]))
host = int(sys.argv[2])
tree = int(sys.stdin.readline())
def release(id):
    return (json.dumps({"id": id, "op": "release", "tree": tree}) + "\n").encode()
s.sendall(release(2))
forged = struct.pack("iII", host, os.getuid(), os.getgid())
s.sendmsg([release(3)], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, forged)])
time.sleep(600)
"#;

/// The host, the container's first process: argv is SOCKET OUT.
const HOST: &str = r#"
import json, os, socket, subprocess, sys, time
path, out = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.settimeout(20)
f = s.makefile("r")
r = {"host": os.getpid(), "uid": os.getuid()}
def reply(id):
    while True:
        got = json.loads(f.readline())
        if got.get("id") == id:
            return got
        if got.get("event", {}).get("kind") == "refused":
            r["refused"] = got["event"]
go_r, go_w = os.pipe()
agent = subprocess.Popen(
    [sys.executable, "-c", sys.argv[3], str(s.fileno()), str(os.getpid())],
    stdin=go_r, pass_fds=[s.fileno()])
os.close(go_r)
pidfd = os.pidfd_open(agent.pid)
socket.send_fds(s, [b'{"id":1,"op":"register","pidfd":true}\n'], [pidfd])
os.close(pidfd)
r["register"] = reply(1)
tree = r["register"]["ok"]["registered"]["tree"]
os.write(go_w, f"{tree}\n".encode())
r["forged"] = reply(3)
s.sendall(b'{"id":4,"op":"list"}\n')
r["list"] = reply(4)
with open(out + ".part", "w") as file:
    json.dump(r, file)
os.rename(out + ".part", out)
time.sleep(600)
"#;

#[test]
fn a_release_naming_the_host_from_a_container_root_is_refused() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    fs::set_permissions(&daemon.dir, PermissionsExt::from_mode(0o777)).unwrap();
    let out = Removed(daemon.dir.join("forged-results.json"));
    let socket = Container::socket(&daemon);
    let cgroup = Cgroup::new("forged-sender");
    let out_path = out.0.to_str().unwrap();
    let mut container = Container::Rootless
        .command(
            &daemon,
            &cgroup,
            "/usr/bin/python3",
            &["-c", HOST, &socket, out_path, AGENT],
        )
        .stdout(Stdio::null())
        .stderr(daemon.clients_log())
        .spawn()
        .unwrap();
    let reported = wait_for(Duration::from_secs(30), || out.0.exists());
    let results: Option<Value> = fs::read_to_string(&out.0)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok());
    // The container goes first, whatever the results: killing unshare kills the container's
    // first process, and with it every process of its pid namespace.
    let _ = container.kill();
    let _ = container.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10)).is_some();
    assert!(
        reported,
        "the host did not report; clients' log:\n{}\ndaemon log:\n{}",
        fs::read_to_string(daemon.dir.join("clients.log")).unwrap_or_default(),
        daemon.log()
    );
    let results = results.expect("the host's results are JSON");
    eprintln!("what the host got: {results:#}");
    assert!(emptied, "the container outlived its first process");

    assert_eq!(
        results["uid"], 0,
        "the host (and its agent) are root inside"
    );
    let tree = &results["register"]["ok"]["registered"]["tree"];
    assert!(tree.is_u64(), "{results:#}");
    // The same line under the agent's own pid: a stranger's, refused unanswered.
    let refused = &results["refused"];
    assert_eq!(refused["code"], "permission_denied", "{results:#}");
    assert_ne!(refused["pid"], results["host"], "{refused}");
    // Under the host's pid: refused all the same, saying why.
    let forged = &results["forged"];
    assert!(
        forged.get("ok").is_none(),
        "a release that named the host was served: {forged}"
    );
    assert_eq!(forged["error"]["code"], "permission_denied", "{forged}");
    let listed = results["list"]["ok"]["trees"].as_array().unwrap();
    assert!(
        listed.iter().any(|t| &t["tree"] == tree),
        "the tree is still held: {listed:?}"
    );
}
