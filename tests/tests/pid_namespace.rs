//! Hosts in another pid namespace (a container's, made here with `unshare`): a pid they send is
//! a number of their namespace, which would name some other process of the daemon's. So a bare
//! pid from such a client is refused, saying why, and never reinterpreted; a process that
//! registers itself (as `leash exec` does) is named by the kernel, right in any namespace. Each
//! runs in a container as root (pid and mount namespaces) and in a rootless one, as uid 61001
//! (a user namespace too, where it is root).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, path_str, setpriv_args},
    wait_for,
};

/// `unshare ARGS` runs the rest in new pid and mount namespaces, with their own /proc: inside,
/// the first process is pid 1 and its children count on from 2. If unshare is killed, so is
/// that first process, and with it the namespace.
const UNSHARE: [&str; 5] = ["--pid", "--fork", "--mount-proc", "--kill-child", "--"];

#[derive(Clone, Copy, Debug)]
enum Container {
    /// New pid and mount namespaces, as root: a container without a user namespace.
    Root,
    /// The same in a new user namespace, as uid 61001 (root inside): a rootless container.
    Rootless,
}

const CONTAINERS: [Container; 2] = [Container::Root, Container::Rootless];

impl Container {
    /// `leash --socket SOCKET ARGS...` run in a container of this kind, inside `cgroup`.
    fn leash(self, daemon: &Daemon, cgroup: &Cgroup, args: &[&str]) -> Command {
        let leash = daemon.leash_for_anyone();
        let mut argv: Vec<String> = match self {
            Container::Root => vec![],
            Container::Rootless => {
                let mut argv = setpriv_args(USER_A);
                argv.extend(["unshare", "--user", "--map-root-user"].map(String::from));
                argv
            }
        };
        argv.extend(UNSHARE.map(String::from));
        argv.extend([path_str(&leash), "--socket", path_str(&daemon.socket)].map(String::from));
        argv.extend(args.iter().map(|a| a.to_string()));
        let program = match self {
            Container::Root => "unshare",
            Container::Rootless => "setpriv",
        };
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        cgroup.command(program, &argv)
    }
}

#[test]
fn a_bare_pid_from_another_pid_namespace_is_refused() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        bare_pid_refused(&daemon, container);
    }
}

fn bare_pid_refused(daemon: &Daemon, container: Container) {
    let cgroup = Cgroup::new("pidns-run");
    // `leash run` registers its child by pid: 2, inside. Taken as the daemon's pid 2, that is
    // kthreadd: as root, a tree that never empties (`leash run` would wait for ever); as uid
    // 61001, a process of root's, refused for that reason and not the true one.
    let mut run = container
        .leash(daemon, &cgroup, &["run", "--", "sleep", "600"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let returned = wait_for(Duration::from_secs(30), || {
        run.try_wait().unwrap().is_some()
    });
    if !returned {
        let _ = run.kill();
    }
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        returned,
        "{container:?}: `leash run` in a pid namespace did not return; the daemon registered {:?}",
        daemon
            .client()
            .list()
            .unwrap()
            .iter()
            .map(|t| t.root)
            .collect::<Vec<_>>()
    );
    assert_eq!(output.status.code(), Some(125), "{container:?}: {stderr}");
    assert!(
        stderr.contains("is a number of the client's pid namespace"),
        "{container:?}: {stderr}"
    );
    assert!(
        daemon.client().list().unwrap().is_empty(),
        "nothing may be registered in its place"
    );
    assert!(
        wait_for(Duration::from_secs(10), || !cgroup.populated()),
        "the refused command was left running: {:?}",
        cgroup.processes()
    );
}

#[test]
fn a_process_in_another_pid_namespace_registers_itself() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    for container in CONTAINERS {
        registers_itself(&daemon, container);
    }
}

fn registers_itself(daemon: &Daemon, container: Container) {
    use std::{io::Write, os::fd::AsRawFd};
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
    let mut unshare = command.spawn().unwrap();
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
        cgroup.wait_empty(Duration::from_secs(30)).is_some(),
        "{container:?}: the tree outlived its host's lease: {:?}",
        cgroup.processes()
    );
    let _ = unshare.wait();
}
