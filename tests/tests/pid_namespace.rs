//! Hosts in containers (made here with `unshare`: see leash_tests::container), each as root and
//! rootless (uid 61001 in a user namespace). A pid such a host sends is a number of its own pid
//! namespace, which would name some other process of the daemon's: a bare pid from it is
//! refused, saying why, and never reinterpreted. A host there names its processes by pidfd
//! (`leash run`, the Rust client) or registers itself (`leash exec`, the Python and Node
//! libraries), and the kernel names them right. Every pid the daemon tells it is its own number
//! for the process. No process outside the container is ever registered or signalled.

use std::{
    collections::BTreeSet,
    fs,
    io::Write,
    os::{fd::AsRawFd, unix::fs::PermissionsExt},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use leash_tests::{
    Cgroup,
    container::{CONTAINERS, Container},
    daemon::{Daemon, path_str},
    hosts_skipped, read_lines, wait_for, workspace_root,
};

const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn a_bare_pid_from_another_pid_namespace_is_refused() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        let reply = container.register_bare_pid(&daemon, &Cgroup::new("pidns-bare"));
        let error = &reply["error"];
        assert_eq!(error["code"], "bad_request", "{container:?}: {reply}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("is a number of the client's pid namespace")),
            "{container:?}: {reply}"
        );
        assert!(
            daemon.client().list().unwrap().is_empty(),
            "{container:?}: nothing may be registered in its place"
        );
    }
}

/// The agent `leash run` starts inside: a setsid child, then what `leash ls --json` shows it,
/// on one line after its own pid.
const AGENT: &str = r#"setsid sleep 600 & echo "root $$"; "$0" --socket "$1" ls --json | tr -d '\n'; echo; exec sleep 600"#;

#[test]
fn leash_run_in_a_container_leashes_its_command_and_shows_its_own_pids() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        leash_run_in(&daemon, container);
    }
}

fn leash_run_in(daemon: &Daemon, container: Container) {
    // Outside the container, as the same uid: never to be signalled.
    let bystanders = Cgroup::new("pidns-bystander");
    let bystander_args = bystander_args(container);
    let bystander_args: Vec<&str> = bystander_args.iter().map(String::as_str).collect();
    let mut bystander = bystanders
        .command("setpriv", &bystander_args)
        .spawn()
        .unwrap();
    let cgroup = Cgroup::new("pidns-run");
    let leash = daemon.leash_for_anyone();
    let socket = Container::socket(daemon);
    // The container's first process is a shell, so that `leash run` can die alone.
    let script = format!(
        r#""$0" --socket "$1" run -- sh -c '{AGENT}' "$0" "$1" & wait"#,
        AGENT = AGENT.replace('\'', r#"'\''"#)
    );
    let mut unshare = container
        .command(
            daemon,
            &cgroup,
            "sh",
            &["-c", &script, path_str(&leash), &socket],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = read_lines(&mut unshare);
    let root_inside: u32 = next_line(&lines, container)
        .strip_prefix("root ")
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("{container:?}: the agent's first line names its pid"));
    let listed_inside: serde_json::Value =
        serde_json::from_str(&next_line(&lines, container)).unwrap();

    // Inside, the tree is shown as the container numbers it.
    let tree_inside = &listed_inside[0];
    assert_eq!(
        tree_inside["root"], root_inside,
        "{container:?}: {listed_inside}"
    );
    let members_inside: BTreeSet<u64> = tree_inside["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap())
        .collect();
    assert!(
        members_inside.contains(&u64::from(root_inside)),
        "{container:?}: {listed_inside}"
    );

    // Outside, the same tree by the daemon's numbers: all of it in the container's cgroup.
    let trees = daemon.client().list().unwrap();
    assert_eq!(trees.len(), 1, "{container:?}: {trees:?}");
    let tree = &trees[0];
    assert_eq!(
        leash::proc::namespace_pids(tree.root).and_then(|n| n.last().copied()),
        Some(root_inside),
        "{container:?}: the root outside ({}) is the agent inside",
        tree.root
    );
    let in_container = cgroup.procs();
    for member in &tree.members {
        assert!(
            in_container.contains(&member.pid),
            "{container:?}: member {} is outside the container",
            member.pid
        );
    }

    // `leash run`, the host, is SIGKILLed: the tree dies with it, the container's shell stays.
    kill(tree.host_pid);
    let emptied = wait_for(DEADLINE, || comms(&cgroup).iter().all(|c| c != "sleep"));
    assert!(
        emptied,
        "{container:?}: the tree outlived its host: {:?}",
        comms(&cgroup)
    );
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "{container:?}: a process outside the container was signalled"
    );
    kill(unshare.id());
    let _ = unshare.wait();
    kill(bystander.id());
    let _ = bystander.wait();
}

/// `leash exec` inside, under the lease of a host outside: the shim registers itself, which the
/// kernel names right (SO_PEERCRED, SO_PEERPIDFD where the kernel has it). The Python and Node
/// libraries spawn through it; this runs on every kernel, where they are not at hand.
#[test]
fn the_exec_shim_registers_itself_in_a_container() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        exec_shim_in(&daemon, container);
    }
}

fn exec_shim_in(daemon: &Daemon, container: Container) {
    let mut host = daemon.client();
    let cgroup = Cgroup::new("pidns-exec");
    let (token_reader, mut token_writer) = std::io::pipe().unwrap();
    writeln!(token_writer, "{}", host.lease().token).unwrap();
    drop(token_writer);
    let fd = token_reader.as_raw_fd().to_string();
    // Inside: the shim registers itself, then runs a tree with a setsid child.
    let mut command = container.leash(
        daemon,
        &cgroup,
        &[
            "exec",
            "--lease-fd",
            &fd,
            "--",
            "sh",
            "-c",
            "setsid sleep 600 & exec sleep 600",
        ],
    );
    leash_client::sys::pass_fd(&mut command, token_reader.into()).unwrap();
    // unshare complains on stderr when the tree's death ends its child.
    let mut unshare = command.stderr(daemon.clients_log()).spawn().unwrap();
    drop(command);

    // unshare itself, outside the tree, and the two sleeps.
    cgroup.settle(3, &["unshare", "sleep"]);
    let trees = host.list().unwrap();
    assert_eq!(trees.len(), 1, "{container:?}: {trees:?}");
    let tree = &trees[0];
    assert_eq!(tree.lease, host.lease().id, "under the host's lease");
    assert_eq!(tree.member_count, 2, "{container:?}: {tree:?}");
    assert!(
        cgroup.procs().contains(&tree.root),
        "{container:?}: the root is named as the daemon sees it: {} is not one of {:?}",
        tree.root,
        cgroup.procs()
    );

    // The host's lease ends: the tree dies, and with its root (pid 1 inside), the namespace.
    drop(host);
    assert!(
        cgroup.wait_empty(DEADLINE).is_some(),
        "{container:?}: the tree outlived its host's lease: {:?}",
        cgroup.processes()
    );
    let _ = unshare.wait();
}

/// A Python host and a Node host, each with its library, inside: the command it spawns is on
/// a leash under the pid the host knows it by, and dies with the host; so is a running process
/// it adopts (by a pidfd: Node's through the `leash adopt` shim, where a bare pid from inside
/// was refused before).
#[test]
fn the_host_libraries_work_in_a_container() {
    if hosts_skipped("container host libraries'") {
        return;
    }
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let libraries = copy_libraries(&daemon.dir);
    for container in CONTAINERS {
        for (program, script) in [
            ("/usr/bin/python3", PYTHON_HOST.to_owned()),
            ("node", node_host(&libraries)),
        ] {
            library_host_in(&daemon, container, program, &script, &libraries);
        }
    }
    fs::remove_dir_all(&libraries).unwrap();
}

/// Prints `{"pid": P, "roots": [...], "registered": [...], "adopted": [...], "kept": [...]}`:
/// the command's pid, the roots of its lease's trees, the pid its `registered` event names; a
/// running process adopted (by pidfd) beside the root its tree got; and a root that exited from
/// a kept tree, beside the pid its `root_exited` event names and the root listed after it.
const PYTHON_HOST: &str = r#"
import json, subprocess, sys, time
sys.path.insert(0, sys.argv[1] + "/python")
import leash
with leash.Lease(socket=sys.argv[2], leash=sys.argv[3]) as lease:
    events = lease.events()
    command = lease.popen(["sh", "-c", "setsid sleep 600 & exec sleep 600"])
    roots = [tree.root for tree in lease.trees()]
    registered = None
    while registered is None:
        event = events.get(timeout=30)
        if event is None or event.kind == "registered":
            registered = [event.pid] if event else []
    running = subprocess.Popen(["sleep", "600"])
    adopted = lease.adopt(running.pid)
    adopted_root = [tree.root for tree in lease.trees() if tree.tree == adopted]
    kept = lease.popen(["sh", "-c", "setsid sleep 600 & exit 0"], keep_on_root_exit=True)
    kept.wait()
    exited = None
    while exited is None:
        event = events.get(timeout=30)
        if event is None or (event.kind == "root_exited" and event.tree == kept.leash_tree):
            exited = [event.pid] if event else []
    kept_root = [tree.root for tree in lease.trees() if tree.tree == kept.leash_tree]
    report = {"pid": command.pid, "roots": roots, "registered": registered,
              "adopted": [running.pid, adopted_root], "kept": [kept.pid, exited, kept_root]}
    print(json.dumps(report), flush=True)
    time.sleep(600)
"#;

fn node_host(libraries: &Path) -> String {
    format!(
        r#"
const {{ Lease }} = await import("{}/node/src/index.js");
const {{ spawn }} = await import("node:child_process");
const [socket, leash] = process.argv.slice(-2);
const lease = await Lease.connect({{ socket, leash }});
const command = lease.spawn("sh", ["-c", "setsid sleep 600 & exec sleep 600"]);
await lease.treeOf(command);
const roots = (await lease.trees()).map((tree) => tree.root);
const running = spawn("sleep", ["600"], {{ stdio: "ignore" }});
const adopted = await lease.adopt(running.pid);
const adoptedRoot = (await lease.trees()).filter((t) => t.tree === adopted).map((t) => t.root);
const report = {{ pid: command.pid, roots, adopted: [running.pid, adoptedRoot] }};
console.log(JSON.stringify(report));
setInterval(() => {{}}, 1000);
"#,
        libraries.display()
    )
}

fn library_host_in(
    daemon: &Daemon,
    container: Container,
    program: &str,
    script: &str,
    libraries: &Path,
) {
    let cgroup = Cgroup::new("pidns-library");
    let leash = daemon.leash_for_anyone();
    let socket = Container::socket(daemon);
    let (socket, leash) = (socket.as_str(), path_str(&leash));
    let host_args: Vec<&str> = match program {
        "node" => vec!["--input-type=module", "-e", script, "--", socket, leash],
        _ => vec!["-c", script, path_str(libraries), socket, leash],
    };
    // The host is not the container's first process, so that it can die alone.
    let mut argv = vec!["-c", r#""$@" & wait"#, "sh", program];
    argv.extend(host_args);
    let mut unshare = container
        .command(daemon, &cgroup, "sh", &argv)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = read_lines(&mut unshare);
    let report: serde_json::Value = serde_json::from_str(&next_line(&lines, container)).unwrap();
    assert_eq!(
        report["roots"],
        serde_json::json!([report["pid"]]),
        "{container:?}, {program}: the tree's root is the command, by the host's own number"
    );
    if let Some(registered) = report.get("registered") {
        assert_eq!(
            registered,
            &serde_json::json!([report["pid"]]),
            "{container:?}, {program}: the registered event names the command by that number"
        );
    }
    if let Some(kept) = report.get("kept") {
        let root = serde_json::json!([kept[0]]);
        assert_eq!(
            (&kept[1], &kept[2]),
            (&root, &root),
            "{container:?}, {program}: a root that has exited keeps its number"
        );
    }
    if let Some(adopted) = report.get("adopted") {
        assert_eq!(
            adopted[1],
            serde_json::json!([adopted[0]]),
            "{container:?}, {program}: a process adopted inside is the root of its tree"
        );
    }
    let trees = daemon.client().list().unwrap();
    let host = trees[0].host_pid;
    assert!(
        trees.iter().all(|tree| tree.host_pid == host),
        "{container:?}, {program}: every tree is the host's: {trees:?}"
    );
    assert!(cgroup.procs().contains(&host), "{container:?}, {program}");
    kill(host);
    assert!(
        wait_for(DEADLINE, || comms(&cgroup).iter().all(|c| c != "sleep")),
        "{container:?}, {program}: the tree outlived its host: {:?}",
        comms(&cgroup)
    );
    kill(unshare.id());
    let _ = unshare.wait();
}

/// Copies of the Python and Node libraries that any user may read.
fn copy_libraries(dir: &Path) -> std::path::PathBuf {
    let libraries = dir.join("libraries");
    let clients = workspace_root().join("clients");
    let status = Command::new("sh")
        .args([
            "-c",
            r#"mkdir -p "$1/python" "$1/node" && cp -r "$2/python/src/leash" "$1/python/" && cp -r "$2/node/src" "$2/node/package.json" "$1/node/" && chmod -R a+rX "$1""#,
            "sh",
        ])
        .arg(&libraries)
        .arg(&clients)
        .status()
        .unwrap();
    assert!(status.success(), "copying the libraries");
    fs::set_permissions(&libraries, fs::Permissions::from_mode(0o755)).unwrap();
    libraries
}

fn bystander_args(container: Container) -> Vec<String> {
    let mut args = leash_tests::daemon::setpriv_args(container.uid());
    args.extend(["sleep", "600"].map(String::from));
    args
}

fn next_line(lines: &mpsc::Receiver<String>, container: Container) -> String {
    lines
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|e| panic!("{container:?}: no line from inside the container: {e}"))
}

fn comms(cgroup: &Cgroup) -> Vec<String> {
    cgroup
        .processes()
        .iter()
        .filter_map(|&pid| leash::proc::process(pid).map(|p| p.comm))
        .collect()
}

fn kill(pid: u32) {
    // SAFETY: kill only sends a signal; the pid is a process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}
