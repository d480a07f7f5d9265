//! The real daemon binary on a socket and a pin directory of the test's own. Dropping it stops
//! the daemon with SIGTERM (which kills every tree it still holds) and removes its directory and
//! its pins (which detaches the programs of a daemon that was SIGKILLed).

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use leash_client::Client;

use crate::{SKIP_BPF_VAR, leash_binary, load_tracker, wait_for};

pub struct Daemon {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Where the daemon pins its programs and maps (on bpffs, which the daemon mounts).
    pub pins: PathBuf,
    args: Vec<String>,
    /// A command that runs the daemon (prlimit, setpriv...), or empty.
    wrapper: Vec<String>,
    process: Child,
}

impl Daemon {
    /// Starts `leash daemon` with `args`, or fails the test saying why. None only when BPF is
    /// unavailable and the runner opted out with LEASH_TEST_SKIP_BPF=1.
    pub fn start(args: &[&str]) -> Option<Self> {
        Self::start_wrapped(&[], args)
    }

    /// [`Daemon::start`], the daemon run by `wrapper` (`prlimit --nofile=64:128`, `setpriv
    /// ...`: a command that ends by executing the rest of its arguments, so that the process
    /// started is the daemon).
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Option<Self> {
        if std::env::var(SKIP_BPF_VAR).is_ok_and(|v| v == "1") {
            load_tracker(leash::Capacity::default())?;
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "leash-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = PathBuf::from("/tmp").join(&name);
        fs::create_dir_all(&dir).unwrap();
        // Other users' clients must reach the socket and the binary copy.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let socket = dir.join("leash.sock");
        // Its own, unless the test names one (and the daemon removes it all the same).
        let pins = args
            .windows(2)
            .find(|pair| pair[0] == "--pin-dir")
            .map_or_else(
                || PathBuf::from("/sys/fs/bpf").join(name),
                |pair| pair[1].into(),
            );
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let wrapper: Vec<String> = wrapper.iter().map(|a| a.to_string()).collect();
        let process = spawn_daemon(&wrapper, &dir, &socket, &pins, &args);
        let mut daemon = Self {
            dir,
            socket,
            pins,
            args,
            wrapper,
            process,
        };
        daemon.await_serving();
        Some(daemon)
    }

    /// SIGKILLs the daemon (no shutdown: its pins stay, and its programs go on tracking).
    pub fn kill_hard(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }

    /// Sends SIGHUP (hand over: exit, leaving every tree tracked in the pins) and waits for the
    /// daemon to exit; returns whether it exited cleanly.
    pub fn hand_over(&mut self) -> bool {
        self.exit_on("HUP")
    }

    /// Starts a new daemon on the same socket and pins, after [`Daemon::kill_hard`] or
    /// [`Daemon::hand_over`].
    pub fn restart(&mut self) {
        assert!(self.has_exited(), "the daemon is still running");
        self.process = spawn_daemon(
            &self.wrapper,
            &self.dir,
            &self.socket,
            &self.pins,
            &self.args,
        );
        self.await_serving();
    }

    /// Waits until the daemon answers a request. It binds its sockets before it loads the
    /// programs (seconds under emulation): a connection alone could come before the pins and the
    /// metrics socket exist.
    fn await_serving(&mut self) {
        let ready = wait_for(Duration::from_secs(60), || {
            answers_status(&self.socket) || self.has_exited()
        });
        let exited = self.process.try_wait().ok().flatten();
        assert!(
            ready && exited.is_none(),
            "leash daemon did not start ({exited:?}); its log:\n{}",
            self.log()
        );
    }

    pub fn client(&self) -> Client {
        Client::connect_to(&self.socket).expect("connecting to the daemon")
    }

    /// `leash --socket SOCKET` for a client command, its stdin empty: at a developer's
    /// terminal, a `leash run` that inherited it would relay through a pty of its own and set
    /// that terminal raw, one test beside another (a caller that writes to it sets its own).
    pub fn leash(&self) -> Command {
        let mut command = Command::new(leash_binary());
        command
            .arg("--socket")
            .arg(&self.socket)
            .stdin(Stdio::null());
        command
    }

    /// `leash --socket SOCKET ARGS...` run as `uid`, inside `cgroup` (joined as root first, so
    /// nothing of it runs outside), from `/`, with stdin empty, stdout discarded and stderr in
    /// [`Daemon::clients_log`] (a caller that reads it sets its own).
    pub fn leash_as(&self, uid: u32, cgroup: &crate::Cgroup, args: &[&str]) -> Command {
        let leash = self.leash_for_anyone();
        let mut argv = setpriv_args(uid);
        argv.extend([path_str(&leash), "--socket", path_str(&self.socket)].map(String::from));
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut command = cgroup.command("setpriv", &argv);
        command
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.clients_log());
        command
    }

    /// A file for the stderr of the clients and trees a test starts and does not read (`leash
    /// run`'s account of a killed tree, a shell's `Killed`, unshare's complaint when its child
    /// dies): shown with the daemon's log when the test fails, and not among the lines of the
    /// tests that pass.
    pub fn clients_log(&self) -> fs::File {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("clients.log"))
            .expect("opening the clients' log")
    }

    /// Sets `command` up to run the Python host library against this daemon: its socket, a
    /// leash binary any user may run, the library's sources (nothing written into them), and
    /// no lease inherited from the caller.
    pub fn python_host<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command
            .env("LEASH_SOCKET", &self.socket)
            .env("LEASH_BIN", self.leash_for_anyone())
            .env(
                "PYTHONPATH",
                crate::workspace_root().join("clients/python/src"),
            )
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("LEASH_LEASE")
    }

    /// The leash binary where any user may run it: [`leash_for_anyone_in`] the daemon's
    /// directory.
    pub fn leash_for_anyone(&self) -> PathBuf {
        leash_for_anyone_in(&self.dir)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Sends SIGTERM and waits for the daemon to exit; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        self.exit_on("TERM")
    }

    /// Sends `signal` and waits (a minute at most, then SIGKILL) for the daemon to exit;
    /// returns whether it exited cleanly.
    fn exit_on(&mut self, name: &str) -> bool {
        signal(self.process.id(), name);
        if !wait_for(Duration::from_secs(60), || self.has_exited()) {
            let _ = self.process.kill();
        }
        self.process.wait().is_ok_and(|s| s.success())
    }

    fn has_exited(&mut self) -> bool {
        self.process.try_wait().ok().flatten().is_some()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.has_exited() {
            self.stop();
        }
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.log());
            let clients = fs::read_to_string(self.dir.join("clients.log")).unwrap_or_default();
            if !clients.is_empty() {
                eprintln!("the clients' stderr:\n{clients}");
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_dir_all(&self.pins);
    }
}

/// `[WRAPPER...] leash daemon --socket SOCKET --pin-dir PINS ARGS...`, logging (appending) to
/// DIR/daemon.log.
fn spawn_daemon(
    wrapper: &[String],
    dir: &Path,
    socket: &Path,
    pins: &Path,
    args: &[String],
) -> Child {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("daemon.log"))
        .unwrap();
    let mut command = match wrapper.split_first() {
        Some((program, wrapper_args)) => {
            let mut command = Command::new(program);
            command.args(wrapper_args).arg(leash_binary());
            command
        }
        None => Command::new(leash_binary()),
    };
    command.arg("daemon").arg("--socket").arg(socket);
    if !args.iter().any(|a| a == "--no-pin" || a == "--pin-dir") {
        command.arg("--pin-dir").arg(pins);
    }
    command
        .args(args)
        .env("LEASH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting leash daemon")
}

/// The leash binary as DIR/leash, where any user may run it if DIR is theirs to enter: the
/// build tree may not be (a clone under /root, mode 0700). A test that runs leash as another
/// user runs this, never [`leash_binary`] (`cargo xtask lint` checks). A hard link, not a copy,
/// where it can be: a file being written cannot be executed, and a copy's write descriptor
/// leaks for a moment into children other threads fork.
pub fn leash_for_anyone_in(dir: &Path) -> PathBuf {
    let link = dir.join("leash");
    if !link.exists() && fs::hard_link(leash_binary(), &link).is_err() {
        let partial = dir.join("leash.partial");
        fs::copy(leash_binary(), &partial).unwrap();
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&partial, &link).unwrap();
        // The copy may still be open for writing in a child forked meanwhile.
        wait_for(Duration::from_secs(10), || {
            Command::new(&link).arg("--version").output().is_ok()
        });
    }
    link
}

/// `kill -SIGNAL pid`, for processes this test started.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// Whether `pid` names a running process (not a zombie).
pub fn alive(pid: u32) -> bool {
    leash::proc::process(pid).is_some_and(|p| p.is_live())
}

pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A tree started under a host's lease inside a cgroup of its own. Dropping it reaps the root;
/// the cgroup, dropped after, kills whatever is left.
pub struct LeashedTree {
    pub tree: leash_client::TreeId,
    pub root: Child,
    pub cgroup: crate::Cgroup,
}

impl LeashedTree {
    /// Its output goes to the cgroup's [`crate::Cgroup::output_log`].
    pub fn spawn(
        host: &mut Client,
        label: &str,
        program: &str,
        args: &[&str],
        options: &leash_client::TreeOptions,
    ) -> Self {
        let cgroup = crate::Cgroup::new(label);
        let mut command = cgroup.command(program, args);
        command
            .stdout(cgroup.output_log())
            .stderr(cgroup.output_log());
        let (tree, root) = host
            .spawn(&mut command, options)
            .expect("spawning a tree under the lease");
        Self { tree, root, cgroup }
    }
}

impl Drop for LeashedTree {
    fn drop(&mut self) {
        let _ = self.root.kill();
        let _ = self.root.wait();
    }
}

/// The unprivileged user the tests act as.
pub const NOBODY: u32 = 65534;

/// A command run as nobody, with no inherited LEASH_SOCKET.
pub fn as_nobody(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(program);
    command.uid(NOBODY).gid(NOBODY).env_remove("LEASH_SOCKET");
    command
}

/// Unprivileged uids of the tests' own, beside [`NOBODY`]: running as one needs no passwd
/// entry, so nothing is added to the system.
pub const USER_A: u32 = 61001;
pub const USER_B: u32 = 61002;

/// The arguments of `setpriv` that run the rest as `uid` (its own gid, no other groups): for a
/// command that joins a cgroup as root first (see [`crate::Cgroup::command`]).
pub fn setpriv_args(uid: u32) -> Vec<String> {
    vec![
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".to_owned(),
    ]
}

/// Whether the daemon at `socket` answers a `status` request (within a second). The connection
/// is read to its end, which the daemon makes once it has ended the connection's lease: the
/// probe is gone from the daemon's counts when this returns.
fn answers_status(socket: &Path) -> bool {
    use std::io::{BufRead, BufReader, Read, Write};
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"{\"id\":1,\"op\":\"status\"}\n").is_err() {
        return false;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let answered = reader.read_line(&mut line).is_ok() && line.contains("\"ok\"");
    let _ = reader.read_to_end(&mut Vec::new());
    answered
}
