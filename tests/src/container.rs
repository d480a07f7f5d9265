//! Containers without a container engine, made with `unshare`: new pid and mount namespaces with
//! their own /proc, as root (a container without a user namespace), or also in a new user
//! namespace as uid 61001, root inside (a rootless container). Inside, the first process is pid
//! 1 and the rest count on from 2: every number a process there has names some other process
//! outside. The daemon's directory is bind-mounted in at another path, as a container mounts
//! /run/leash: clients inside reach its socket at [`Container::socket`].

use std::process::Command;

use leash_client::protocol::PROTOCOL_VERSION;

use crate::{
    Cgroup,
    daemon::{Daemon, USER_A, path_str, setpriv_args},
};

/// `unshare ARGS` runs the rest in new pid and mount namespaces, with their own /proc. If
/// unshare is killed, so is the first process inside, and with it the namespace.
const UNSHARE: [&str; 5] = ["--pid", "--fork", "--mount-proc", "--kill-child", "--"];

/// Starts a child, then asks the daemon to register it by its pid; prints the reply.
const BARE_PID_CLIENT: &str = r#"
import json, socket, subprocess, sys
child = subprocess.Popen(["sleep", "600"])
connection = socket.socket(socket.AF_UNIX)
connection.connect(sys.argv[1])
stream = connection.makefile("rw")
def ask(request):
    stream.write(json.dumps(request) + "\n")
    stream.flush()
    return json.loads(stream.readline())
ask({"id": 1, "op": "hello", "protocol": int(sys.argv[2])})
print(json.dumps(ask({"id": 2, "op": "register", "pid": child.pid})), flush=True)
child.kill()
child.wait()
"#;

#[derive(Clone, Copy, Debug)]
pub enum Container {
    /// New pid and mount namespaces, as root.
    Root,
    /// The same in a new user namespace, as uid 61001 (root inside).
    Rootless,
}

pub const CONTAINERS: [Container; 2] = [Container::Root, Container::Rootless];

impl Container {
    /// Where the daemon's socket is, inside a container of `daemon`'s: its directory is
    /// mounted at `inside/` below itself.
    pub fn socket(daemon: &Daemon) -> String {
        let inside = daemon.dir.join("inside");
        // Made by root, outside, as an engine makes its mount points.
        let _ = std::fs::create_dir(&inside);
        path_str(&inside.join("leash.sock")).to_owned()
    }

    /// `program args...` run in a new container of this kind, inside `cgroup`, with the
    /// daemon's directory bind-mounted in (see [`Container::socket`]). The container's first
    /// process runs `program`.
    pub fn command(
        self,
        daemon: &Daemon,
        cgroup: &Cgroup,
        program: &str,
        args: &[&str],
    ) -> Command {
        let socket = Self::socket(daemon);
        let mut argv: Vec<String> = match self {
            Container::Root => vec![],
            Container::Rootless => {
                let mut argv = setpriv_args(USER_A);
                argv.extend(["unshare", "--user", "--map-root-user"].map(String::from));
                argv
            }
        };
        argv.extend(UNSHARE.map(String::from));
        let mount_point = socket.trim_end_matches("/leash.sock");
        argv.extend(
            [
                "sh",
                "-c",
                r#"mount --bind "$0" "$1" && shift && exec "$@""#,
                path_str(&daemon.dir),
                mount_point,
                program,
            ]
            .map(String::from),
        );
        argv.extend(args.iter().map(|a| a.to_string()));
        let outer = match self {
            Container::Root => "unshare",
            Container::Rootless => "setpriv",
        };
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        cgroup.command(outer, &argv)
    }

    /// `leash --socket SOCKET ARGS...` run in a new container of this kind, inside `cgroup`.
    pub fn leash(self, daemon: &Daemon, cgroup: &Cgroup, args: &[&str]) -> Command {
        let leash = daemon.leash_for_anyone();
        let socket = Self::socket(daemon);
        let mut argv = vec!["--socket", &socket];
        argv.extend(args);
        self.command(daemon, cgroup, path_str(&leash), &argv)
    }

    /// What the daemon replies, in a new container of this kind, to a client that starts a
    /// child and asks to register it by its pid (a number of the container's namespace).
    pub fn register_bare_pid(self, daemon: &Daemon, cgroup: &Cgroup) -> serde_json::Value {
        let protocol = PROTOCOL_VERSION.to_string();
        let socket = Self::socket(daemon);
        let argv = ["-c", BARE_PID_CLIENT, &socket, &protocol];
        let output = self
            .command(daemon, cgroup, "/usr/bin/python3", &argv)
            .output()
            .unwrap();
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "{self:?}: no reply from the client in the container ({e}): {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
    }

    /// The uid processes of this container run as, outside it.
    pub fn uid(self) -> u32 {
        match self {
            Container::Root => 0,
            Container::Rootless => USER_A,
        }
    }
}
