//! Connections parked behind a stuck close cost their user alone. uid 61002 sticks its lane of
//! the daemon's disposal: it sends a Unix socket that holds another, six deep, the innermost
//! holding a loopback TCP socket that lingers an hour on a send queue its peer never reads, so
//! the close of the one the daemon cannot empty (it empties four deep) waits out the linger.
//! Then it connects, sends a line with a pipe end and closes, thousands of times. Each such
//! connection's socket once waited in the stuck lane, one daemon descriptor each, until the
//! daemon had none left: another user's `leash run` failed, and their tree outlived its host.
//! Now an account parks at most a few connection sockets there; the rest go to a queue in the
//! kernel that costs the daemon no descriptor, and its new connections are refused at accept.

use std::{sync::mpsc, time::Duration};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str},
    open_descriptors,
    script::Script,
    victim::{Victim, run_true},
    wait_for,
};

/// The daemon's descriptor limit: the flood, parked unbounded, goes past it.
const NOFILE: u64 = 4096;
/// Connections the attacker makes after sticking its lane, each leaving a descriptor.
const FLOOD: u32 = 6000;

/// argv: SOCKET FLOOD. Sticks its lane, floods, prints `sent ...` with what one more connection
/// is told, and holds everything (the lingering socket's peer among it) until killed.
const ATTACKER: &str = r#"
import json, os, resource, socket, struct, sys, time
path, flood = sys.argv[1], int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
listener.bind(("127.0.0.1", 0))
listener.listen(8)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
s.connect(listener.getsockname())
peer, _ = listener.accept()  # never read
s.setblocking(False)
try:
    while True:
        s.send(b"x" * 65536)
except BlockingIOError:
    pass
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 3600))
inner = s.detach()
for _ in range(6):
    a, b = socket.socketpair()
    socket.send_fds(a, [b"x"], [inner])
    os.close(inner)
    a.close()
    inner = b.detach()
line = json.dumps({"id": 1, "op": "status"}).encode() + b"\n"
c = socket.socket(socket.AF_UNIX)
c.connect(path)
socket.send_fds(c, [line], [inner])
os.close(inner)
# Ended once the daemon has taken the chain; its close is the last, and waits.
c.settimeout(10)
try:
    while c.recv(65536):
        pass
except OSError:
    pass
c.close()
r, w = os.pipe()
sent = failed = 0
for _ in range(flood):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(5)
    try:
        c.connect(path)
        socket.send_fds(c, [line], [w])
        sent += 1
    except OSError:
        failed += 1
    c.close()
# What a new connection is told now (once the daemon's queue has room for it).
told = ""
for _ in range(1000):
    c = socket.socket(socket.AF_UNIX)
    c.settimeout(10)
    try:
        c.connect(path)
        told = c.makefile().readline().strip()
        break
    except BlockingIOError:
        time.sleep(0.01)
    finally:
        c.close()
print("sent", sent, "failed", failed, "then told:", told, flush=True)
sys.stdin.read()
"#;

#[test]
fn connections_parked_behind_a_stuck_close_delay_no_other_users_enforcement() {
    let nofile = format!("--nofile={NOFILE}:{NOFILE}");
    let Some(daemon) = Daemon::start_wrapped(&["prlimit", &nofile, "--"], &[]) else {
        return;
    };
    // uid 61001's host, registered before the attack.
    let mut victim = Victim::start(&daemon, USER_A, "parked-flood");
    let before = open_descriptors(daemon.pid());

    let attacker_cgroup = Cgroup::new("parked-flood-attacker");
    let flood = FLOOD.to_string();
    let args = [path_str(&daemon.socket), flood.as_str()];
    let attacker = Script::start_as(USER_B, &attacker_cgroup, ATTACKER, &args);
    // The daemon's descriptors, sampled from the attack to the end of the test: it may take
    // the attacker's connections well after the attacker has sent them.
    let most = Sampler::start(daemon.pid());
    let report = attacker.lines.recv_timeout(Duration::from_secs(120));
    let report = report.expect("the attacker did not finish its flood within 120 s");
    eprintln!("attacker: {report}");

    let (registered, took) = run_true(&daemon, USER_A, "parked-flood", Duration::from_secs(30));
    eprintln!(
        "uid {USER_A}'s leash run behind the parked connections: {registered:?} after {took:?}"
    );
    let emptied = victim.kill_host();
    eprintln!("uid {USER_A}'s tree emptied {emptied:?} after its host's SIGKILL");
    let most = most.stop();
    eprintln!("daemon descriptors: {before} before, at most {most} during (limit {NOFILE})");
    drop(attacker);
    attacker_cgroup.kill_all();

    assert!(
        registered.is_some_and(|status| status.success()),
        "uid {USER_A}'s leash run failed behind uid {USER_B}'s parked connections:\n{}",
        daemon.log()
    );
    let emptied = emptied.unwrap_or_else(|| {
        panic!(
            "uid {USER_A}'s tree outlived its host behind uid {USER_B}'s parked connections: \
             {:?}",
            victim.procs()
        )
    });
    assert!(emptied < Duration::from_secs(1), "{emptied:?}");
    assert!(
        report.contains("waiting to be closed behind a close"),
        "the attacker's connections were not refused while its lane was stuck: {report}"
    );
    assert!(
        most < NOFILE / 2,
        "the attack took {most} of the daemon's {NOFILE} descriptors"
    );
    // Once the attacker is gone, its stuck close returns and what waited behind it is closed.
    let back = wait_for(Duration::from_secs(30), || {
        open_descriptors(daemon.pid()) <= before + 8
    });
    assert!(
        back,
        "the daemon kept {} descriptors after the attacker left ({before} before)",
        open_descriptors(daemon.pid())
    );
}

/// The most descriptors a process had while it was sampled, every 10 ms.
struct Sampler {
    stop: mpsc::Sender<()>,
    most: std::thread::JoinHandle<u64>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let (stop, stopped) = mpsc::channel();
        let most = std::thread::spawn(move || {
            let mut most = 0;
            while stopped.recv_timeout(Duration::from_millis(10)).is_err() {
                most = most.max(open_descriptors(pid));
            }
            most
        });
        Self { stop, most }
    }

    fn stop(self) -> u64 {
        let _ = self.stop.send(());
        self.most.join().unwrap_or(0)
    }
}
