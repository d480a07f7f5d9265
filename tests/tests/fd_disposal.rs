//! No descriptor a client sends can block a daemon thread or pile up. The weapon: a loopback TCP
//! socket with `SO_LINGER` on (an hour) and a full send queue that its peer never reads; its
//! last close waits out the linger. An unprivileged user sends such sockets to the daemon
//! directly (the 5th of 5 descriptors in a message: a daemon that took 4 had the kernel close
//! the 5th in its serving thread), inside an AF_UNIX socket that holds them queued (its close
//! closes them), and queued on the connection itself behind a line that ends it (the
//! connection's close closes them), and to the metrics socket (where a plain read had the
//! kernel close them in the daemon's thread). Meanwhile another user's `status` answers and their
//! `leash run` works, and the daemon's descriptors stay bounded. They come back while the
//! attacker still holds the lingering sockets' peers: each lingering socket, sent directly or
//! queued in a Unix socket or on the connection, is taken out and closed abortively.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup, Removed,
    daemon::{Daemon, USER_A, USER_B, path_str},
    open_descriptors,
    script::Script,
    wait_for,
};

/// How long another user's `status` may take while the attack goes on.
const STATUS_DEADLINE: Duration = Duration::from_secs(5);
/// How long their `leash run -- true` may take.
const RUN_DEADLINE: Duration = Duration::from_secs(15);
/// Connections the attacker uses at once (more than the daemon's two serving threads).
const AT_ONCE: &str = "3";
/// The descriptors each uid may have waiting to be closed (the daemon's disposal::PER_UID),
/// and its connection limit: what the attacker can make the daemon hold, with room to spare.
const HELD_AT_MOST: u64 = 1024 + 128 + 64;

/// The attacker, as a uid of its own: makes lingering sockets, sends them as `mode` says on
/// `AT_ONCE` connections at a time for `rounds` rounds, then `flood` messages of five pipe
/// ends each on connections of their own; prints `sent` and holds every peer (unread) until
/// it is killed.
const ATTACKER: &str = r#"
import json, os, socket, struct, sys, time
path, mode, at_once, rounds, flood = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
peers = []
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
listener.bind(("127.0.0.1", 0))
listener.listen(64)

def lingering():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    s.connect(listener.getsockname())
    peer, _ = listener.accept()
    peers.append(peer)  # never read
    s.setblocking(False)
    try:
        while True:
            s.send(b"x" * 65536)
    except BlockingIOError:
        pass
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3600))
    return s.detach()

def holder():
    # An AF_UNIX socket with two lingering sockets queued on it: its last close closes them.
    a, b = socket.socketpair()
    inner = [lingering(), lingering()]
    socket.send_fds(a, [b"x"], inner)
    for fd in inner:
        os.close(fd)
    a.close()
    return b.detach()

def pipe_ends(n):
    ends = []
    while len(ends) < n:
        ends.extend(os.pipe())
    return ends

line = json.dumps({"id": 1, "op": "status"}).encode() + b"\n"
if mode == "metrics":
    line = b"GET /metrics HTTP/1.1\r\nHost: leash\r\n\r\n"

kept = []

def send(s, fds):
    try:
        socket.send_fds(s, [line], fds)
    except OSError:
        # Not sent: kept open, as the attacker's own last close of a lingering socket would
        # wait out its linger.
        kept.extend(fds)
        return False
    for fd in fds:
        os.close(fd)
    return True

def connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    return s

# The daemon's close of what is sent must be the last, so the attacker closes its own copies
# before the daemon reads them (else its own close would be the one to wait). On the daemon's
# socket: more requests than its uid's rate allows (200 a second), so that it does not read the
# connection for half a second, then more padding than it reads at once (8 KiB), so that it
# cannot have read what follows before. On the metrics socket: its 8 connections held while the
# attack connections wait to be accepted.
burst = line * 201 + b" " * 9000 + b"\n"
def wait_end(s, deadline):
    # Whether the daemon ended the connection (end of file) before the deadline; its replies
    # are read meanwhile, and thrown away.
    try:
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            if not s.recv(65536):
                return 1
    except socket.timeout:
        return 0
    except OSError:
        return 1

deadline = time.monotonic() + 20
held = []
queued = 0
ended = 0
for _ in range(rounds):
    blockers = [connect() for _ in range(8 if mode == "metrics" else 0)]
    connections = [connect() for _ in range(at_once)]
    for s in connections:
        if mode not in ("metrics", "embryo"):
            s.sendall(burst)
        if mode in ("direct", "metrics", "embryo"):
            send(s, pipe_ends(4) + [lingering()])
        elif mode == "nested":
            send(s, pipe_ends(4) + [holder()])
        elif mode == "queued":
            # A pipe end ends the connection as it is read; what follows it stays queued.
            send(s, pipe_ends(1))
            queued += sum(send(s, pipe_ends(4) + [lingering()]) for _ in range(2))
    for s in blockers:
        s.close()
    if mode == "embryo":
        # Never accepted: the daemon cannot read them before it closes its listener.
        held.extend(connections)
        continue
    # Once the daemon has ended them, it has taken (or left queued) all they carried.
    for s in connections:
        ended += wait_end(s, deadline)
        s.close()
sent = 0
try:
    for _ in range(flood):
        s = connect()
        sent += send(s, pipe_ends(5))
        s.close()
except OSError as e:
    print("flood stopped:", e, flush=True)
print("sent", "queued", queued, "flood", sent, "ended", ended, "of", rounds * at_once, flush=True)
sys.stdin.read()
"#;

#[test]
fn lingering_sockets_five_to_a_message_hold_up_no_one() {
    attack("direct", 2, 0);
}

#[test]
fn a_socket_holding_lingering_sockets_holds_up_no_one_and_nothing_piles_up() {
    // The first holder's close blocks; 300 messages of 5 descriptors each follow it: more
    // than the attacker's uid may have waiting.
    attack("nested", 2, 300);
}

#[test]
fn lingering_sockets_queued_on_an_ended_connection_hold_up_no_one() {
    attack("queued", 2, 0);
}

#[test]
fn lingering_sockets_sent_to_the_metrics_socket_hold_up_no_one() {
    // A plain read there would have the kernel close them in the daemon's thread.
    let dir = Removed(PathBuf::from(format!(
        "/tmp/leash-fd-metrics-{}",
        std::process::id()
    )));
    fs::create_dir(&dir.0).unwrap();
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
    let metrics = dir.0.join("metrics.sock");
    // The socket is root's and a scrapers' group's: the attacker is in that group.
    let group = USER_A.to_string();
    let args = ["--metrics", path_str(&metrics), "--metrics-group", &group];
    attack_on("metrics", 4, 0, &args, Some(&metrics));
}

fn attack(mode: &str, rounds: u32, flood: u32) {
    attack_on(mode, rounds, flood, &[], None);
}

#[test]
fn lingering_sockets_on_connections_not_yet_accepted_hold_up_no_shutdown() {
    // The daemon runs out of descriptors, so connections wait in its listener's queue; the
    // attacker sends on them. Its shutdown closes the listener, and them with it, before it
    // kills every tree.
    leash::sys::raise_fd_limit().expect("raising this test's own descriptor limit");
    let Some(daemon) = Daemon::start_wrapped(&["prlimit", "--nofile=64:128", "--"], &[]) else {
        return;
    };
    let pid = daemon.pid();
    let tree = Cgroup::new("fd-shutdown-tree");
    let mut host = daemon
        .leash()
        .args(["run", "--grace", "100ms", "--"])
        .args(tree.argv("sleep", &["600"]))
        .stdin(Stdio::null())
        // It says that the daemon's shutdown killed its tree.
        .stderr(daemon.clients_log())
        .spawn()
        .unwrap();
    tree.settle_exactly(&["sleep"]);
    let idle: Vec<UnixStream> = (0..200)
        .map(|_| UnixStream::connect(&daemon.socket).expect("connecting to the daemon"))
        .collect();
    // Every descriptor it may have in use, so accept(2) itself fails (as in fd_exhaustion).
    let steady = wait_until_steady(pid);
    let lowest_free = (0..).find(|fd| !steady.contains(fd)).unwrap_or(0);
    set_soft_limit(pid, lowest_free);

    let attacker_group = Cgroup::new("fd-attacker");
    let mut attacker = Attacker::start(&daemon.socket, &attacker_group, "embryo", 1, 0);
    let report = attacker.wait_sent(Duration::from_secs(60));
    assert!(
        report.is_some(),
        "the attacker did not send what it meant to"
    );

    let started = Instant::now();
    leash_tests::daemon::signal(pid, "TERM");
    // Descriptors for the kill, once it accepts no more connections.
    let stopping = wait_for(Duration::from_secs(10), || {
        daemon.log().contains("shutting down")
    });
    assert!(stopping, "the daemon did not begin to shut down");
    set_soft_limit(pid, 128);
    let emptied = tree.wait_empty(Duration::from_secs(10));
    let exited = wait_for(Duration::from_secs(10), || !leash_tests::daemon::alive(pid));
    eprintln!(
        "shutdown: tree empty after {emptied:?}, daemon exited: {exited} ({:?})",
        started.elapsed()
    );
    assert!(
        emptied.is_some(),
        "the shutdown did not kill the tree:\n{}",
        daemon.log()
    );
    assert!(exited, "the daemon did not exit:\n{}", daemon.log());
    let _ = host.kill();
    let _ = host.wait();
    drop(idle);
}

/// The descriptors process `pid` has open once they have not changed for about 300 ms.
fn wait_until_steady(pid: u32) -> BTreeSet<u64> {
    let look = || -> BTreeSet<u64> {
        fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|dir| {
                dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut last = look();
    let mut unchanged = 0;
    let steady = wait_for(Duration::from_secs(30), || {
        let now = look();
        unchanged = if now == last { unchanged + 1 } else { 0 };
        last = now;
        unchanged >= 30
    });
    assert!(steady, "the daemon's descriptors never settled");
    last
}

fn set_soft_limit(pid: u32, soft: u64) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--nofile={soft}:128")])
        .status()
        .unwrap();
    assert!(status.success(), "prlimit --pid failed");
}

/// Runs the attacker (`mode`, `rounds`, `flood`) as USER_A against a daemon started with
/// `args`, on `target` (the daemon's own socket if None), then checks that USER_B is served
/// and the daemon's descriptors stay bounded, and come back once the attacker is gone.
fn attack_on(mode: &str, rounds: u32, flood: u32, args: &[&str], target: Option<&Path>) {
    let Some(daemon) = Daemon::start(args) else {
        return;
    };
    let target = target.unwrap_or(&daemon.socket);
    let started = Instant::now();
    let user_b = Cgroup::new("fd-user-b");
    // Served once first: the daemon has its programs and maps loaded, its threads started.
    let status = run_within(
        daemon.leash_as(USER_B, &user_b, &["status"]),
        STATUS_DEADLINE,
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "status before the attack: {status:?}"
    );
    let before = open_descriptors(daemon.pid());
    let attacker_group = Cgroup::new("fd-attacker");
    let mut attacker = Attacker::start(target, &attacker_group, mode, rounds, flood);
    let report = attacker.wait_sent(Duration::from_secs(60));
    eprintln!(
        "attacker ({mode}): {report:?} after {:?}",
        started.elapsed()
    );

    let status = run_within(
        daemon.leash_as(USER_B, &user_b, &["status"]),
        STATUS_DEADLINE,
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "another user's status got no answer within {STATUS_DEADLINE:?} ({status:?}) after \
         the attack ({mode}, {report:?}):\n{}",
        daemon.log()
    );
    let run = run_within(
        daemon.leash_as(USER_B, &user_b, &["run", "--", "true"]),
        RUN_DEADLINE,
    );
    assert!(
        run.is_some_and(|s| s.success()),
        "another user's leash run did not work within {RUN_DEADLINE:?} ({run:?}) after the \
         attack ({mode}):\n{}",
        daemon.log()
    );
    let report = report.expect("the attacker sent everything it meant to");
    let words: Vec<&str> = report.split_whitespace().collect();
    let field = |name: &str| {
        let at = words.iter().position(|w| *w == name)?;
        words.get(at + 1)?.parse::<u32>().ok()
    };
    assert_eq!(
        field("ended"),
        field("of"),
        "the daemon did not end every attack connection: {report}"
    );
    if mode == "queued" {
        assert_ne!(
            field("queued"),
            Some(0),
            "nothing was left queued on a connection: {report}"
        );
    }
    let during = open_descriptors(daemon.pid());
    eprintln!("daemon descriptors: {before} before, {during} during the attack");
    assert!(
        during <= before + HELD_AT_MOST,
        "the daemon's descriptors went from {before} to {during}"
    );

    // Sent directly, a lingering socket is closed abortively; queued in a Unix socket or on
    // the connection, it is taken out first and closed the same way: nothing waits, even while
    // its peer is still there.
    let closed = wait_for(Duration::from_secs(10), || {
        open_descriptors(daemon.pid()) <= before + 4
    });
    assert!(
        closed,
        "the daemon still holds {} descriptors ({before} before): {:?}",
        open_descriptors(daemon.pid()),
        fd_targets(daemon.pid())
    );

    // The attacker goes: its peers reset the lingering sockets, and every stuck close ends.
    drop(attacker);
    drop(attacker_group);
    let back = wait_for(Duration::from_secs(20), || {
        open_descriptors(daemon.pid()) <= before + 4
    });
    assert!(
        back,
        "the daemon kept {} descriptors after the attacker left ({before} before): {:?}",
        open_descriptors(daemon.pid()),
        fd_targets(daemon.pid())
    );
    eprintln!("test took {:?}", started.elapsed());
}

/// The attacker process; killed (with its group) when dropped.
struct Attacker(Script);

impl Attacker {
    fn start(target: &Path, group: &Cgroup, mode: &str, rounds: u32, flood: u32) -> Self {
        let (rounds, flood) = (rounds.to_string(), flood.to_string());
        let args = [path_str(target), mode, AT_ONCE, &rounds, &flood];
        Self(Script::start_as(USER_A, group, ATTACKER, &args))
    }

    /// The attacker's `sent` line, once it has sent everything, or None at the deadline.
    fn wait_sent(&mut self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.0.lines.recv_timeout(left) {
                Ok(line) if line.starts_with("sent") => return Some(line),
                Ok(line) => eprintln!("attacker: {line}"),
                Err(_) => return None,
            }
        }
    }
}

/// Runs `command`, killed (and failed) if it has not exited within `deadline`.
fn run_within(mut command: std::process::Command, deadline: Duration) -> Option<ExitStatus> {
    let mut child = command.stderr(Stdio::inherit()).spawn().unwrap();
    let mut status = None;
    wait_for(deadline, || {
        status = child.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// What process `pid`'s descriptors are (their /proc/PID/fd links), for a failure's message.
fn fd_targets(pid: u32) -> Vec<String> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let target = fs::read_link(entry.ok()?.path()).ok()?;
        Some(target.display().to_string())
    })
    .collect()
}
