//! One user's flood costs that user alone. While uid 61002 floods the daemon (hundreds of
//! connections pipelining `status` and `list`, never reading their replies), uid 61001's host
//! is SIGKILLed: its tree must still be emptied, and the flooder must have been limited
//! (connections over its cap refused, requests over its rate refused), every refusal said to it
//! with `limit_reached`.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, setpriv_args},
    victim::Victim,
    wait_for,
};

const CONNECTIONS: usize = 300;

/// argv: SOCKET CONNECTIONS. Opens the connections and reads each one's answer to a first
/// `status` (a reply, or the refusal of a connection over the cap), says `flooding` on stdout,
/// then sends pipelined `status` and `list` requests on every one until stdin closes, never
/// reading a reply until then. Then it reads what each connection has been sent so far and
/// prints the counts. A connection over the cap is refused as it is accepted, while its uid
/// has as many being set up, or once it is set up, while it holds as many open: either way
/// one line. The refusals are counted before the flood: during it the daemon closes
/// connections that leave too much unread (`closing`, `not_reading`), and the connections that
/// were still waiting to be accepted then fit under the cap.
const FLOOD: &str = r#"
import os, socket, sys, select, json, threading
path, count = sys.argv[1], int(sys.argv[2])
conns = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    conns.append(s)
# First each connection's first line, while all are open: the daemon has accepted or refused
# every one before the flood starts, and none has yet been closed for not reading.
refused_connections = 0
for s in conns:
    s.settimeout(30)
    try:
        s.sendall(b'{"id":0,"op":"status"}\n')
    except OSError:
        pass
    first = b""
    try:
        while not first.endswith(b"\n"):
            chunk = s.recv(1)
            if not chunk:
                break
            first += chunk
    except OSError:
        pass
    # Over the cap while it is set up (refused as it is accepted), or once it is.
    if b"limit_reached" in first and (b"connections open" in first or b"being set up" in first):
        refused_connections += 1
    s.setblocking(False)
print("flooding", flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
burst = (b'{"id":1,"op":"status"}\n' * 50 + b'{"id":2,"op":"list"}\n') * 4
while not stop.is_set():
    for s in conns:
        try:
            s.send(burst)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass
rate_refusals = answered = 0
# Done: read what each connection has been sent so far, without waiting for more.
for s in conns:
    data = b""
    try:
        while len(data) < 4_000_000:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except (BlockingIOError, InterruptedError, OSError):
        pass
    for line in data.split(b"\n"):
        if b"limit_reached" in line and not (b"connections open" in line or b"being set up" in line):
            rate_refusals += 1
        elif b'"ok"' in line:
            answered += 1
print(json.dumps({"refused_connections": refused_connections,
                  "rate_refusals": rate_refusals, "answered": answered}), flush=True)
"#;

#[test]
fn a_flood_by_one_user_delays_no_other_users_enforcement() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // uid 61001's host: `leash run` with a tree of two sleeps.
    let mut victim = Victim::start(&daemon, USER_A, "flood");

    let flood_cgroup = Cgroup::new("flood-flooder");
    let mut flooder = start_flooder(&daemon, &flood_cgroup);
    // The host dies once the flood is at its height: the daemon is refusing the flooder's
    // connections and requests both (each kind has its log line).
    assert!(
        wait_for(Duration::from_secs(20), || {
            let log = daemon.log();
            ["connections", "requests"].iter().all(|limit| {
                log.lines().any(|line| {
                    line.contains("over its limit") && line.contains(&format!("\"{limit}\""))
                })
            })
        }),
        "the flood never reached the daemon's limits:\n{}",
        daemon.log()
    );

    let emptied = victim.kill_host();

    drop(flooder.stdin.take());
    let mut report = String::new();
    BufReader::new(flooder.stdout.take().unwrap())
        .read_line(&mut report)
        .unwrap();
    let _ = flooder.wait();
    eprintln!("flooder: {report}");
    eprintln!("uid {USER_A}'s tree emptied {emptied:?} after its host's SIGKILL");
    assert!(
        emptied.is_some(),
        "uid {USER_A}'s tree outlived its host under uid {USER_B}'s flood: {:?}",
        victim.procs()
    );
    let report: serde_json::Value = serde_json::from_str(&report).expect("the flooder's counts");
    let refused = report["refused_connections"].as_u64().unwrap();
    assert_eq!(
        refused,
        (CONNECTIONS - 128) as u64,
        "connections over the default cap of 128 per uid are refused: {report}"
    );
    assert!(
        report["rate_refusals"].as_u64().unwrap() > 0,
        "requests over the rate are refused: {report}"
    );
    // The daemon is still there for everyone.
    daemon.client().status().unwrap();
}

fn start_flooder(daemon: &Daemon, cgroup: &Cgroup) -> Child {
    let mut args = setpriv_args(USER_B);
    args.extend(
        [
            "/usr/bin/python3",
            "-c",
            FLOOD,
            path_str(&daemon.socket),
            &CONNECTIONS.to_string(),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command: Command = cgroup.command("setpriv", &args);
    let mut flooder = command
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(flooder.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "flooding", "the flooder did not start");
    flooder
}

/// A client that pipelines many requests and reads every reply is served whole, however far
/// ahead it writes: the daemon reads its next request when its replies have gone out.
#[test]
fn a_client_that_pipelines_and_reads_is_served_every_reply() {
    const REQUESTS: usize = 5000;
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let requests: String = (0..REQUESTS)
            .map(|id| format!("{{\"id\":{id},\"op\":\"list\"}}\n"))
            .collect();
        writer.write_all(requests.as_bytes())
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answered = 0;
    for line in BufReader::new(&stream).lines() {
        let Ok(line) = line else { break };
        assert!(line.contains("\"ok\""), "an error: {line}");
        answered += 1;
        if answered == REQUESTS {
            break;
        }
    }
    sender.join().unwrap().unwrap();
    assert_eq!(answered, REQUESTS, "every pipelined request is answered");
}
