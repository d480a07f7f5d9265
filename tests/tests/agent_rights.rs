//! The agent inside a tree runs under its host's uid and may run any shell command: it must not
//! be able to cut its own leash. As uid 61001, a host (`leash run`) runs an agent that speaks the
//! protocol itself and tries what a uid alone used to allow: release its tree, kill it with a
//! ten-minute grace, kill another host's tree. Each is refused. What it may do (register itself
//! under a helper's lease, which outlives its host; register a child of its own and release the
//! child's tree) nests inside its tree and frees nothing: when the host is SIGKILLed, the whole
//! cgroup empties, and the other host's tree lives on.

use std::{fs, time::Duration};

use leash_tests::{
    Cgroup, Removed,
    daemon::{Daemon, USER_A, path_str},
    wait_for,
};
use serde_json::Value;

/// The agent: argv is SOCKET OUT OTHER_TREE HELPER_TOKEN OUTSIDE_PID.
const AGENT: &str = r#"
import json, os, socket, subprocess, sys, time
sock, out, other, helper = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
outside = int(sys.argv[5])
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
f = s.makefile("rw")
def ask(op):
    f.write(json.dumps(op) + "\n")
    f.flush()
    while True:
        line = json.loads(f.readline())
        if "event" not in line:
            return line
trees = ask({"id": 1, "op": "list"})["ok"]["trees"]
own = [t["tree"] for t in trees if any(m["pid"] == os.getpid() for m in t["members"])][0]
r = {"own": own, "visible": sorted(t["tree"] for t in trees)}
r["release_own"] = ask({"id": 2, "op": "release", "tree": own})
# Were it allowed, this would start killing this very process (the test then sees no report).
r["kill_own"] = ask({"id": 8, "op": "kill", "tree": own, "grace_ms": 600000})
r["kill_other"] = ask({"id": 3, "op": "kill", "tree": other, "grace_ms": 0})
# Its host (`leash run`, outside the tree, of the same uid): were it allowed, the host would be
# a member of a tree nested in the agent's, and its own kill of the agent's tree would find
# nothing.
r["register_host"] = ask({"id": 11, "op": "register", "pid": os.getppid()})
r["register_outside"] = ask({"id": 12, "op": "register", "pid": outside, "lease": helper})
# Under a helper's lease (another host, which outlives this one), keeping its children.
r["register_self"] = ask({"id": 4, "op": "register", "pid": os.getpid(), "on_root_exit": "keep", "lease": helper})
child = subprocess.Popen(["sleep", "600"], start_new_session=True)
r["register_child"] = ask({"id": 5, "op": "register", "pid": child.pid})
nested = r["register_child"].get("ok", {}).get("registered", {}).get("tree", 0)
r["release_child"] = ask({"id": 6, "op": "release", "tree": nested})
r["list"] = ask({"id": 7, "op": "list"})["ok"]["trees"]
# Itself again with no pid (the connection names the process, as for `leash exec`): it then
# runs in that tree, and sees only it.
r["register_self_unnamed"] = ask({"id": 9, "op": "register", "on_root_exit": "keep", "lease": helper})
r["list_unnamed"] = ask({"id": 10, "op": "list"})["ok"]["trees"]
with open(out + ".part", "w") as file:
    json.dump(r, file)
os.rename(out + ".part", out)
time.sleep(600)
"#;

fn error_code(reply: &Value) -> &str {
    reply["error"]["code"]
        .as_str()
        .unwrap_or("none (it was allowed)")
}

#[test]
fn the_agent_cannot_release_or_kill_its_own_tree_and_what_it_registers_stays_inside() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let out = Removed(daemon.dir.join("agent-results.json"));
    // The agent reports there.
    fs::set_permissions(
        &daemon.dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let run_as_user = |cgroup: &Cgroup, command: &[&str]| {
        let mut args = vec!["run", "--"];
        args.extend(command);
        daemon.leash_as(USER_A, cgroup, &args).spawn().unwrap()
    };

    // Another host of the same uid, with a tree of its own.
    let other = Cgroup::new("other-host");
    let mut other_host = run_as_user(&other, &["sleep", "600"]);
    other.settle_exactly(&["leash", "sleep"]);
    // The helper: a host whose lease lives on after the agent's host dies.
    let mut helper = daemon.client();
    let helper_token = helper.lease().token.clone();
    let other_tree = helper
        .list()
        .unwrap()
        .iter()
        .find(|t| other.procs().contains(&t.root))
        .expect("the other host's tree")
        .tree;

    // A process of the same uid in no tree: the agent may signal it, but not put it on a leash.
    let bystander = Cgroup::new("bystander");
    let mut setpriv = leash_tests::daemon::setpriv_args(USER_A);
    setpriv.extend(["sleep".to_owned(), "600".to_owned()]);
    let setpriv: Vec<&str> = setpriv.iter().map(String::as_str).collect();
    let mut bystander_process = bystander.command("setpriv", &setpriv).spawn().unwrap();
    let agent = Cgroup::new("agent");
    let other_arg = other_tree.to_string();
    let outside_arg = bystander_process.id().to_string();
    let mut host = run_as_user(
        &agent,
        &[
            "/usr/bin/python3",
            "-c",
            AGENT,
            path_str(&daemon.socket),
            path_str(&out.0),
            &other_arg,
            &helper_token,
            &outside_arg,
        ],
    );
    assert!(
        wait_for(Duration::from_secs(60), || out.0.exists()),
        "the agent did not report (was it killed by its own request?); daemon log:\n{}",
        daemon.log()
    );
    let results: Value = serde_json::from_str(&fs::read_to_string(&out.0).unwrap()).unwrap();
    eprintln!("what the agent got: {results:#}");
    let own = results["own"].as_u64().unwrap();

    assert_eq!(error_code(&results["release_own"]), "permission_denied");
    assert_eq!(error_code(&results["kill_own"]), "permission_denied");
    assert_eq!(error_code(&results["kill_other"]), "not_found");
    assert_eq!(
        error_code(&results["register_host"]),
        "permission_denied",
        "the agent may not put its host on a leash"
    );
    assert_eq!(
        error_code(&results["register_outside"]),
        "permission_denied",
        "nor a process of its uid outside its tree"
    );
    assert_eq!(
        results["visible"].as_array().unwrap().len(),
        1,
        "the agent sees its own tree only"
    );
    // Registering itself nests a tree inside its own; so does registering its child.
    let nested_self = &results["register_self"]["ok"]["registered"];
    assert!(nested_self.is_object(), "{}", results["register_self"]);
    assert!(
        results["register_child"]["ok"].is_object(),
        "{}",
        results["register_child"]
    );
    assert!(
        results["release_child"]["ok"].is_object(),
        "{}",
        results["release_child"]
    );
    let listed = results["list"].as_array().unwrap();
    let self_tree = listed
        .iter()
        .find(|t| t["tree"] == nested_self["tree"])
        .expect("the agent's nested tree is listed");
    assert_eq!(
        self_tree["nested_in"].as_u64(),
        Some(own),
        "nested in its own tree"
    );
    // Registered with no pid, it is nested too: in the tree it runs in by then.
    let unnamed = &results["register_self_unnamed"]["ok"]["registered"]["tree"];
    let unnamed_tree = results["list_unnamed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| &t["tree"] == unnamed)
        .unwrap_or_else(|| panic!("{}", results["register_self_unnamed"]));
    assert_eq!(
        unnamed_tree["nested_in"], nested_self["tree"],
        "nested in the tree it runs in"
    );

    // The host dies: everything the agent started dies with it, the released child included,
    // and the tree held by the helper's lease, which lives on.
    host.kill().unwrap();
    let _ = host.wait();
    let emptied = agent.wait_empty(Duration::from_secs(30));
    assert!(
        emptied.is_some(),
        "survivors of the host's death: {:?}",
        agent.procs()
    );
    assert!(helper.status().is_ok(), "the helper's lease is alive");
    // The other host's tree was never touched.
    assert_eq!(other.procs().len(), 2, "the other host's tree is intact");
    other_host.kill().unwrap();
    let _ = other_host.wait();
    bystander_process.kill().unwrap();
    let _ = bystander_process.wait();
}
