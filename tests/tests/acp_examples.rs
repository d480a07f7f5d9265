//! The ACP examples against the real daemon: the Python host (clients/python/examples/
//! acp_host.py) and the Node one (clients/node/examples/acp-daemon.js), each with the small ACP
//! agent (clients/node/examples/acp-agent.js), each run as an unprivileged user (USER_A, as a
//! desktop app runs) inside a cgroup of the test's own, the ground truth for "the host's agent
//! and every tool it started".
//!
//! The prompt is a shell command; the agent asks permission to run it
//! (session/request_permission), the host's default policy allows it and logs it, and the tool
//! (in a session of its own, as the agent starts tools) writes a marker and sleeps. SIGKILLing
//! the host must take the agent and the tool along. With the `reject` policy the tool never
//! runs.

use std::{
    fs,
    io::Write,
    os::unix::{fs::chown, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc::Receiver,
    time::Duration,
};

use leash_tests::{
    Cgroup, SKIP_HOSTS_VAR, copy_readable,
    daemon::{Daemon, USER_A, alive, path_str, setpriv_args},
    hosts_skipped, on_path, read_lines, wait_for, workspace_root,
};

/// A deadline, not a delay: each run takes about a second.
const WAIT: Duration = Duration::from_secs(60);
/// The interpreter the Python host runs on: the system's, which USER_A may run (`python3` on
/// PATH may be a pyenv shim under /root).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// The tool: writes its pid into the marker (whole, by a rename), then becomes a long sleep.
const TOOL: &str = "echo $$ > tool.partial && mv tool.partial tool-ran && exec sleep 600";

#[test]
fn the_python_acp_host_runs_the_allowed_tool_and_its_death_kills_agent_and_tool() {
    let Some(setup) = Setup::new() else { return };
    let cgroup = Cgroup::new("acp-python");
    let host = setup.python_host(&cgroup, "allow");
    let agent: u32 = host
        .line("host: agent pid ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let permission = host.line("host: permission: ");
    assert!(
        permission.starts_with("allow-once ") && permission.ends_with(TOOL),
        "the default policy allows the call and logs its title and command: {permission}"
    );
    let tool = setup.tool_pid(&host);
    host.killed_leaving_nothing(&cgroup, &[agent, tool]);
}

#[test]
fn the_python_acp_host_with_the_reject_policy_runs_no_tool() {
    let Some(setup) = Setup::new() else { return };
    let cgroup = Cgroup::new("acp-python-reject");
    let mut host = setup.python_host(&cgroup, "reject");
    host.line("host: permission: rejected ");
    let refused = host.line("host: session/update: ");
    assert!(
        refused.contains(r#""status": "failed""#) && refused.contains("permission refused"),
        "the agent reports the call refused: {refused}"
    );
    assert_eq!(host.line("host: prompt answered: "), "end_turn");
    // The lease closed: the agent was killed (it takes SIGTERM).
    let agent_status = host.line("host: done, agent exit status ");
    assert!(
        agent_status.starts_with('-'),
        "the agent was not killed: {agent_status}"
    );
    let status = wait_child(&mut host.process);
    assert!(
        status.success(),
        "the host failed ({status}): {}",
        host.stderr()
    );
    assert!(
        !setup.marker().exists(),
        "the tool ran though the policy rejected it"
    );
    assert!(cgroup.procs().is_empty(), "left: {:?}", cgroup.procs());
}

#[test]
fn the_node_acp_daemon_runs_the_allowed_tool_and_its_death_kills_agent_and_tool() {
    let Some(setup) = Setup::new() else { return };
    let cgroup = Cgroup::new("acp-node");
    let mut host = setup.node_host(&cgroup);
    let work = path_str(&setup.work);
    host.send(&serde_json::json!({"id": 1, "method": "session/new", "params": {"cwd": work}}));
    let session = host.answer(1);
    let agent = session["agentPid"]
        .as_u64()
        .and_then(|pid| u32::try_from(pid).ok())
        .expect("the agent's pid");
    assert!(
        session["tree"].is_u64(),
        "the agent is on a tree: {session}"
    );
    let prompt = serde_json::json!({
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": session["sessionId"], "prompt": [{"type": "text", "text": TOOL}]},
    });
    host.send(&prompt);
    let tool = setup.tool_pid(&host);
    // The policy's log line, on stderr.
    let logged = format!("acp-daemon: session 1: allow-once \"Run `{TOOL}`\": {TOOL}");
    assert!(
        wait_for(WAIT, || host.stderr().contains(&logged)),
        "the default policy logs the call it allows ({logged}); stderr:\n{}",
        host.stderr()
    );
    host.killed_leaving_nothing(&cgroup, &[agent, tool]);
}

/// A daemon, copies of the examples that USER_A may read, and a working directory of USER_A's.
struct Setup {
    daemon: Daemon,
    /// The copies: clients/node/{package.json,src,examples}, clients/python/{src,examples}.
    clients: PathBuf,
    node: PathBuf,
    work: PathBuf,
}

impl Setup {
    fn new() -> Option<Self> {
        if hosts_skipped("ACP examples'") {
            return None;
        }
        let how = format!(
            "the ACP examples' tests need Node.js (`cargo xtask test` installs it) and {SYSTEM_PYTHON}, \
             or set {SKIP_HOSTS_VAR}=1 to leave them out"
        );
        let node = on_path("node").unwrap_or_else(|| panic!("no `node` on PATH: {how}"));
        assert!(
            Path::new(SYSTEM_PYTHON).is_file(),
            "no {SYSTEM_PYTHON}: {how}"
        );
        let daemon = Daemon::start(&[])?;
        let (source, clients) = (workspace_root().join("clients"), daemon.dir.join("clients"));
        for part in [
            "node/package.json",
            "node/src",
            "node/examples",
            "python/src/leash",
            "python/examples",
        ] {
            copy_readable(&source.join(part), &clients.join(part));
        }
        let work = daemon.dir.join("work");
        fs::create_dir(&work).unwrap();
        chown(&work, Some(USER_A), Some(USER_A)).unwrap();
        Some(Self {
            daemon,
            clients,
            node,
            work,
        })
    }

    fn marker(&self) -> PathBuf {
        self.work.join("tool-ran")
    }

    /// `python3 acp_host.py --policy POLICY --prompt TOOL -- node acp-agent.js`.
    fn python_host(&self, cgroup: &Cgroup, policy: &str) -> Host {
        let host = self.clients.join("python/examples/acp_host.py");
        let agent = self.clients.join("node/examples/acp-agent.js");
        let args = [
            SYSTEM_PYTHON,
            "-s",
            path_str(&host),
            "--grace",
            "0.3",
            "--policy",
            policy,
            "--prompt",
            TOOL,
            "--",
            path_str(&self.node),
            path_str(&agent),
        ];
        let mut command = self.as_user_a(cgroup, &args);
        command
            .env("PYTHONPATH", self.clients.join("python/src"))
            .env("PYTHONDONTWRITEBYTECODE", "1");
        Host::start(
            command,
            &self.daemon.dir.join(format!("python-{policy}.stderr")),
        )
    }

    /// `node acp-daemon.js`, its client's stdin piped.
    fn node_host(&self, cgroup: &Cgroup) -> Host {
        let host = self.clients.join("node/examples/acp-daemon.js");
        let mut command = self.as_user_a(cgroup, &[path_str(&self.node), path_str(&host)]);
        command.stdin(Stdio::piped());
        Host::start(command, &self.daemon.dir.join("node.stderr"))
    }

    /// `args` run as USER_A in `cgroup`, in the working directory, against the test's daemon.
    fn as_user_a(&self, cgroup: &Cgroup, args: &[&str]) -> Command {
        let mut argv = setpriv_args(USER_A);
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut command = cgroup.command("setpriv", &argv);
        command
            .current_dir(&self.work)
            .env("HOME", &self.work)
            .env("LEASH_SOCKET", &self.daemon.socket)
            .env("LEASH_BIN", self.daemon.leash_for_anyone())
            .env_remove("LEASH_LEASE");
        command
    }

    /// Waits for the tool's marker; returns the tool's pid, which it holds.
    fn tool_pid(&self, host: &Host) -> u32 {
        let marker = self.marker();
        assert!(
            wait_for(WAIT, || marker.exists()),
            "the tool never ran; the host's stderr:\n{}",
            host.stderr()
        );
        let text = fs::read_to_string(&marker).unwrap();
        text.trim()
            .parse()
            .unwrap_or_else(|e| panic!("the marker holds no pid ({e}): {text:?}"))
    }
}

/// A host started as USER_A: its stdout read line by line, its stderr in a file.
struct Host {
    process: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: PathBuf,
}

impl Host {
    fn start(mut command: Command, stderr: &Path) -> Self {
        let mut process = command
            .stdout(Stdio::piped())
            .stderr(fs::File::create(stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let lines = read_lines(&mut process);
        let stdin = process.stdin.take();
        Self {
            process,
            stdin,
            lines,
            stderr: stderr.to_owned(),
        }
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The rest of the next line that starts with `prefix`.
    fn line(&self, prefix: &str) -> String {
        loop {
            let line = self.lines.recv_timeout(WAIT).unwrap_or_else(|e| {
                panic!(
                    "the host said no {prefix:?} ({e}); its stderr:\n{}",
                    self.stderr()
                )
            });
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    fn send(&mut self, message: &serde_json::Value) {
        let stdin = self.stdin.as_mut().expect("the host's stdin is piped");
        writeln!(stdin, "{message}").expect("writing to the host");
        stdin.flush().expect("writing to the host");
    }

    /// The result of the Node host's answer to request `id`.
    fn answer(&self, id: u64) -> serde_json::Value {
        loop {
            let line = self.line("");
            let message: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("the host wrote no JSON ({e}): {line}"));
            if message["id"].as_u64() == Some(id) {
                assert!(
                    message["error"].is_null(),
                    "request {id} failed: {message}; stderr:\n{}",
                    self.stderr()
                );
                return message["result"].clone();
            }
        }
    }

    /// SIGKILLs the host while `pids` (its agent and tool) run in `cgroup`; they must die, and
    /// nothing be left in the group.
    fn killed_leaving_nothing(mut self, cgroup: &Cgroup, pids: &[u32]) {
        let running = cgroup.procs();
        for pid in pids {
            assert!(
                running.contains(pid) && alive(*pid),
                "{pid} is not running in the host's group: {running:?}"
            );
        }
        self.process.kill().unwrap();
        let status = wait_child(&mut self.process);
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "the host ended otherwise ({status}): {}",
            self.stderr()
        );
        assert!(
            cgroup.wait_empty(WAIT).is_some(),
            "left running after the host's death: {:?}",
            cgroup.procs()
        );
        for pid in pids {
            assert!(!alive(*pid), "{pid} outlived its host");
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Waits (with the deadline) for `child` to exit.
fn wait_child(child: &mut Child) -> ExitStatus {
    let mut status = None;
    wait_for(WAIT, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap_or_else(|| panic!("process {} did not exit", child.id()))
}
