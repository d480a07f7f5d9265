//! A host's death seen as it begins: the kernel reports a host a fatal signal has set exiting
//! (SIGKILL, the OOM killer), or one that takes a fatal signal's default action, and its leases
//! end then (`host_killed`), not when its socket closes or its pidfd turns readable after the
//! kernel has torn down its memory (`host_exited`). A signal the host catches, ignores or
//! blocks, and a thread's exit, are no death.
//!
//! The hosts are Python processes on the host library, each in a cgroup of its own with its
//! agent (`sleep`): the cgroup is the ground truth for "the host and its tree are gone".

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::Receiver,
    time::Duration,
};

use leash_tests::{
    Cgroup, cgroup2_root,
    daemon::{Daemon, alive, signal},
    python, read_lines, wait_for,
};

/// A host: registers `sleep 600` as its agent, prints the agent's pid, then does what its mode
/// says and waits for a line on stdin.
const HOST: &str = r#"
import os, signal, sys, threading, leash
mode = sys.argv[1]
if mode == "lives-on":
    # Before the library starts its reader thread, which inherits the mask.
    caught = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: caught.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
lease = leash.Lease()
agent = lease.popen(["sleep", "600"], grace=0.5)

def touched(size):
    memory = bytearray(size)
    memory[::4096] = b"\x01" * len(memory[::4096])
    return memory

if mode == "memory":
    held = touched(int(sys.argv[2]) << 20)
elif mode == "socket-child":
    # A child outside the tree that keeps a copy of the lease's socket open.
    if os.fork() == 0:
        signal.pause()
        os._exit(0)
elif mode == "lives-on":
    worker = threading.Thread(target=lambda: None)
    worker.start()
    worker.join()
print(f"agent {agent.pid}", flush=True)
if mode == "lives-on":
    # The handler runs in the main thread once it runs Python code: wait in short turns.
    while not caught.wait(0.05):
        pass
    print("caught", flush=True)
sys.stdin.readline()
if mode == "lives-on":
    # SIGUSR1, pending since it was blocked, now takes its default action.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
elif mode == "oom":
    hoard = []
    while True:
        hoard.append(touched(8 << 20))
sys.stdin.readline()
"#;

// A deadline, not a delay: under emulation, loaded, touching 1 GiB alone can take half a minute.
pub(crate) const WAIT: Duration = Duration::from_secs(120);

/// A host started in `cgroup`, with the pid of its agent.
pub(crate) struct Host {
    pub(crate) process: Child,
    lines: Receiver<String>,
    /// Where its stderr goes: told when it fails to say what it should.
    stderr: PathBuf,
    pub(crate) agent: u32,
}

impl Host {
    pub(crate) fn start(daemon: &Daemon, cgroup: &Cgroup, args: &[&str]) -> Self {
        let stderr = daemon.dir.join(format!(
            "{}.stderr",
            cgroup.path().file_name().unwrap().to_string_lossy()
        ));
        let mut process = daemon
            .python_host(&mut cgroup.command(&python(), &[&["-c", HOST][..], args].concat()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).expect("the host's stderr"))
            .spawn()
            .expect("starting a Python host");
        let lines = read_lines(&mut process);
        let mut host = Self {
            process,
            lines,
            stderr,
            agent: 0,
        };
        let line = host.line("agent ");
        host.agent = line.parse().expect("the agent's pid");
        host
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    /// The rest of the next line that starts with `prefix`.
    fn line(&self, prefix: &str) -> String {
        loop {
            let line = self.lines.recv_timeout(WAIT).unwrap_or_else(|e| {
                let stderr = fs::read_to_string(&self.stderr).unwrap_or_default();
                panic!("the host said no {prefix:?} ({e}); its stderr:\n{stderr}")
            });
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_owned();
            }
        }
    }

    fn go_on(&mut self) {
        let stdin = self.process.stdin.as_mut().expect("piped");
        stdin.write_all(b"\n").expect("writing to the host");
        stdin.flush().expect("writing to the host");
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Why the lease of host `pid` ended, from the daemon's log: None while it lives.
fn lease_end(daemon: &Daemon, pid: u32) -> Option<String> {
    let host = format!(" host_pid={pid} ");
    daemon
        .log()
        .lines()
        .filter(|line| line.contains("event=\"lease_ended\"") && line.contains(&host))
        .find_map(|line| {
            let (_, reason) = line.split_once("reason=\"")?;
            Some(reason.split('"').next()?.to_owned())
        })
}

/// Waits for the lease of host `pid` to end, and says why it did.
pub(crate) fn awaited_lease_end(daemon: &Daemon, pid: u32) -> String {
    let mut reason = None;
    wait_for(WAIT, || {
        reason = lease_end(daemon, pid);
        reason.is_some()
    });
    reason.unwrap_or_else(|| panic!("the lease of host {pid} never ended:\n{}", daemon.log()))
}

pub(crate) fn await_dead(pid: u32, what: &str) {
    assert!(
        wait_for(WAIT, || !alive(pid)),
        "{what} {pid} outlived its host"
    );
}

#[test]
fn a_host_whose_socket_stays_open_is_seen_dying() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("host-socket-child");
    let mut host = Host::start(&daemon, &cgroup, &["socket-child"]);
    // Forked before the agent's line, which Host::start waited for.
    let child: u32 = cgroup
        .procs()
        .into_iter()
        .find(|&pid| pid != host.pid() && pid != host.agent)
        .expect("the host's child");
    host.process.kill().unwrap();
    let _ = host.process.wait();
    await_dead(host.agent, "agent");
    assert_eq!(awaited_lease_end(&daemon, host.pid()), "host_killed");
    assert!(
        alive(child),
        "the child holding the socket was not the tree's"
    );
}

#[test]
fn a_host_that_lives_on_is_not_taken_for_dead() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("host-lives-on");
    let mut host = Host::start(&daemon, &cgroup, &["lives-on"]);
    // Its thread has exited; now a caught SIGTERM, an ignored SIGHUP, a blocked SIGUSR1.
    for name in ["HUP", "USR1", "TERM"] {
        signal(host.pid(), name);
    }
    host.line("caught");
    // Whatever the kernel reported of this host is queued before what it reports of another
    // host killed after it, and the daemon acts on reports in order.
    let other = Cgroup::new("host-killed-after");
    let mut killed = Host::start(&daemon, &other, &["memory", "1"]);
    killed.process.kill().unwrap();
    let _ = killed.process.wait();
    assert_eq!(awaited_lease_end(&daemon, killed.pid()), "host_killed");
    assert_eq!(lease_end(&daemon, host.pid()), None, "{}", daemon.log());
    assert!(alive(host.agent), "the living host's agent was killed");

    // Unblocked, SIGUSR1 takes its default action: a death the kernel reports as it is
    // delivered.
    host.go_on();
    await_dead(host.agent, "agent");
    assert_eq!(awaited_lease_end(&daemon, host.pid()), "host_killed");
}

#[test]
fn a_host_the_oom_killer_kills_is_seen_dying() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("host-oom");
    let limit = MemoryLimit::new("host-oom", 48 << 20);
    let mut host = Host::start(&daemon, &cgroup, &["oom"]);
    // The agent goes with it into the limited group, where the host is the largest process.
    limit.admit(host.pid());
    limit.admit(host.agent);
    host.go_on();
    await_dead(host.agent, "agent");
    assert_eq!(awaited_lease_end(&daemon, host.pid()), "host_killed");
    assert!(
        limit.oom_kills() >= 1,
        "the host died of something else than the OOM killer"
    );
}

/// A memory-limited group of the test's own: cgroup v2's memory controller where it is
/// enabled, else v1's memory hierarchy. Dropping it kills what is in it and removes it.
struct MemoryLimit {
    path: PathBuf,
    v2: bool,
}

impl MemoryLimit {
    fn new(label: &str, bytes: u64) -> Self {
        let name = format!("leash-test-{}-{label}", std::process::id());
        let v2_root = cgroup2_root();
        let controllers =
            fs::read_to_string(v2_root.join("cgroup.controllers")).unwrap_or_default();
        let (path, v2) = if controllers.split_whitespace().any(|c| c == "memory") {
            // The root may take controllers for its children whatever runs in it.
            fs::write(v2_root.join("cgroup.subtree_control"), "+memory")
                .expect("enabling the memory controller below the cgroup2 root");
            (v2_root.join(&name), true)
        } else {
            let v1 = v1_memory_root().expect(
                "the OOM test needs a memory controller: cgroup v2's (in cgroup.controllers of \
                 the cgroup2 root) or a cgroup v1 memory hierarchy",
            );
            (v1.join(&name), false)
        };
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        let limit = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        fs::write(path.join(limit), bytes.to_string()).expect("setting the memory limit");
        Self { path, v2 }
    }

    fn admit(&self, pid: u32) {
        fs::write(self.path.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.path.display()));
    }

    /// How many processes the OOM killer has killed in the group.
    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        fs::read_to_string(self.path.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryLimit {
    fn drop(&mut self) {
        let procs = || fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
        for pid in procs().split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
        wait_for(WAIT, || procs().trim().is_empty());
        let _ = fs::remove_dir(&self.path);
    }
}

/// Where cgroup v1's memory hierarchy is mounted, if it is.
fn v1_memory_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut fields = after.split_whitespace();
        let (kind, options) = (fields.next()?, fields.nth(1)?);
        let is_memory = kind == "cgroup" && options.split(',').any(|o| o == "memory");
        let mount_point = before.split_whitespace().nth(4)?;
        is_memory.then(|| Path::new(mount_point).to_path_buf())
    })
}
