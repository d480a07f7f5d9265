//! `leash daemon --metrics`: the figures a scrape shows after real work (trees registered and
//! killed for each reason, refusals of each kind), read with a real Prometheus parser (Python's
//! `prometheus_client`, from the test environment `cargo xtask test` makes in
//! target/hosts/python) and linted with `promtool check metrics` (from Debian's prometheus
//! package, which `cargo xtask test` unpacks into target/hosts/promtool); the endpoint on a
//! Unix socket and on loopback TCP; clients that send nothing or junk, which neither stop a
//! scrape nor delay enforcement; and the addresses refused.
//!
//! Without the parser or promtool the tests that need them fail, saying how to get them,
//! unless LEASH_TEST_SKIP_HOSTS=1 leaves the host tools out on purpose.

use std::{
    collections::BTreeMap,
    fs,
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    os::unix::{fs::PermissionsExt, net::UnixStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use leash_client::TreeOptions;
use leash_tests::{
    Cgroup, SKIP_HOSTS_VAR,
    daemon::{Daemon, LeashedTree, USER_A, path_str, setpriv_args},
    hosts_skipped, leash_binary, settable_limit, wait_for, workspace_root,
};
use serde_json::Value;

/// Conditions are awaited this long at most: the machine may be slow and busy.
const PATIENCE: Duration = Duration::from_secs(60);

/// A directory of the test's own for the metrics socket (root's, 0755, as the daemon
/// requires), removed when dropped.
struct SocketDir(PathBuf);

impl SocketDir {
    fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from(format!(
            "/tmp/leash-metrics-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        Self(dir)
    }

    fn socket(&self) -> PathBuf {
        self.0.join("metrics.sock")
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An HTTP response as read off the wire.
struct Response {
    status: u16,
    head: String,
    body: String,
}

/// Sends `request` on `stream` and reads the response to its end (the endpoint closes every
/// connection after one response).
fn exchange(mut stream: impl Read + Write, request: &str) -> Response {
    stream
        .write_all(request.as_bytes())
        .expect("sending a request");
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .expect("reading the response");
    let text = String::from_utf8(bytes).expect("a UTF-8 response");
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of the response head in {text:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

const GET_METRICS: &str = "GET /metrics HTTP/1.1\r\nHost: leash\r\n\r\n";

fn unix(socket: &Path) -> UnixStream {
    let stream = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// `GET /metrics` on the Unix socket; the body, after checking the status and content type.
fn scrape(socket: &Path) -> String {
    checked(exchange(unix(socket), GET_METRICS))
}

fn scrape_tcp(addr: SocketAddr) -> String {
    let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    checked(exchange(stream, GET_METRICS))
}

fn checked(response: Response) -> String {
    assert_eq!(response.status, 200, "{}", response.head);
    assert!(
        response
            .head
            .to_ascii_lowercase()
            .contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8"),
        "{}",
        response.head
    );
    response.body
}

/// A scrape as Python's prometheus_client parses it: each family's type, and every sample's
/// value by its name and labels.
#[derive(Debug)]
struct Parsed {
    types: BTreeMap<String, String>,
    samples: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl Parsed {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = (
            name.to_owned(),
            labels
                .iter()
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        );
        *self
            .samples
            .get(&key)
            .unwrap_or_else(|| panic!("no sample {key:?} in {:#?}", self.samples))
    }
}

/// The test environment's Python, or None when the host tools are left out on purpose.
fn parser_python() -> Option<PathBuf> {
    if hosts_skipped("metrics parser's") {
        return None;
    }
    let python = workspace_root().join("target/hosts/python/bin/python");
    let found = Command::new(&python)
        .args(["-c", "import prometheus_client.parser"])
        .output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "no prometheus_client in {} ({found:?}): run `cargo xtask test`, which installs it \
         (or set {SKIP_HOSTS_VAR}=1 to leave the host tools out)",
        python.display()
    );
    Some(python)
}

/// promtool, as `cargo xtask test` unpacks it, or the system's.
fn promtool() -> PathBuf {
    let unpacked = workspace_root().join("target/hosts/promtool/usr/bin/promtool");
    let promtool = if unpacked.is_file() {
        unpacked.clone()
    } else {
        PathBuf::from("promtool")
    };
    let works = Command::new(&promtool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        works,
        "no promtool that runs (looked for {} and on PATH): run `cargo xtask test`, which \
         unpacks it from Debian's prometheus package (or set {SKIP_HOSTS_VAR}=1 to leave the \
         host tools out)",
        unpacked.display()
    );
    promtool
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
families = [
    {"name": f.name, "type": f.type, "help": f.documentation,
     "samples": [[s.name, s.labels, s.value] for s in f.samples]}
    for f in text_string_to_metric_families(sys.stdin.read())
]
json.dump(families, sys.stdout)
"#;

/// Runs `program` with `input` on its standard input; its status and outputs.
fn run_with_input(command: &mut Command, input: &str) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_owned();
    let writer = thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    output
}

/// Parses `text` with prometheus_client, and lints it with promtool, which must find nothing.
fn parse_and_lint(python: &Path, text: &str) -> Parsed {
    let output = run_with_input(Command::new(python).args(["-c", PARSE]), text);
    assert!(
        output.status.success(),
        "prometheus_client could not parse the scrape ({}): {}\n{text}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let families: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let mut parsed = Parsed {
        types: BTreeMap::new(),
        samples: BTreeMap::new(),
    };
    for family in families {
        let name = family["name"].as_str().unwrap().to_owned();
        assert!(
            !family["help"].as_str().unwrap_or_default().is_empty(),
            "{name} has no help"
        );
        parsed
            .types
            .insert(name, family["type"].as_str().unwrap().to_owned());
        for sample in family["samples"].as_array().unwrap() {
            let labels = sample[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            let key = (sample[0].as_str().unwrap().to_owned(), labels);
            parsed.samples.insert(key, sample[2].as_f64().unwrap());
        }
    }
    let lint = run_with_input(Command::new(promtool()).args(["check", "metrics"]), text);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );
    assert!(
        lint.status.success() && said.trim().is_empty(),
        "promtool check metrics found problems ({}):\n{said}\nin:\n{text}",
        lint.status
    );
    parsed
}

/// Scrapes until `ready` holds for what a quick reading shows (the endpoint serves a reading
/// for up to a second), then returns the last scrape.
fn scrape_until(socket: &Path, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let ready = wait_for(PATIENCE, || {
        last = scrape(socket);
        ready(&last)
    });
    assert!(ready, "the scrape never showed {what}:\n{last}");
    last
}

/// The value of the sample line `series` (name and labels as written), read from the text
/// without a parser: only to know when to parse.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Sends one line on a connection of its own and returns the reply line.
fn speak(socket: &Path, line: &str) -> Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(line.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let mut byte = [0u8];
    while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        reply.push(byte[0]);
    }
    serde_json::from_slice(&reply)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&reply)))
}

/// `leash run -- sh -c 'sleep 1000 & exit 0'` inside a cgroup: the root exits at once, so the
/// tree is killed (root_exited) and `leash run` returns when it is empty; the cgroup says
/// nothing is left.
fn a_tree_whose_root_exits(daemon: &Daemon) {
    let cgroup = Cgroup::new("metrics-root-exits");
    let leash = leash_binary();
    let status = cgroup
        .command(
            path_str(&leash),
            &[
                "--socket",
                path_str(&daemon.socket),
                "run",
                "--",
                "sh",
                "-c",
                "sleep 1000 & exit 0",
            ],
        )
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "leash run: {status}");
    assert!(
        wait_for(PATIENCE, || !cgroup.populated()),
        "the tree whose root exited was not killed: {:?} are left",
        cgroup.procs()
    );
}

#[test]
fn a_scrape_counts_what_the_daemon_did() {
    // Readable by other users: they run only the system's Python (scrape_as); root runs the
    // parser from the build tree.
    let Some(python) = parser_python() else {
        return;
    };
    let dir = SocketDir::new();
    let socket = dir.socket();
    let started = SystemTime::now();
    let Some(daemon) = Daemon::start(&[
        "--metrics",
        path_str(&socket),
        "--max-trees",
        "100",
        "--max-members",
        "5000",
    ]) else {
        return;
    };
    let fresh = parse_and_lint(&python, &scrape(&socket));
    // What the daemon was started with.
    assert_eq!(fresh.value("leash_trees_capacity", &[]), 100.0);
    assert_eq!(fresh.value("leash_members_capacity", &[]), 5000.0);
    assert_eq!(fresh.value("leash_trees", &[]), 0.0);
    assert_eq!(
        fresh.value(
            "leash_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    for (family, kind) in [
        ("leash_trees", "gauge"),
        ("leash_members", "gauge"),
        ("leash_leases", "gauge"),
        ("leash_trees_capacity", "gauge"),
        ("leash_members_capacity", "gauge"),
        ("leash_kills", "counter"),
        ("leash_kill_failures", "counter"),
        ("leash_kill_duration_seconds", "histogram"),
        ("leash_requests_refused", "counter"),
        ("leash_events_dropped", "counter"),
        ("leash_kernel_events_dropped", "counter"),
        ("leash_member_inserts_failed", "counter"),
        ("leash_program_skips", "counter"),
        ("leash_members_reconciled", "counter"),
        ("leash_forks_refused", "counter"),
        ("leash_membership", "gauge"),
        ("leash_trees_registered", "counter"),
        ("process_cpu_seconds", "counter"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert_eq!(
            fresh.types.get(family).map(String::as_str),
            Some(kind),
            "{family} in {:?}",
            fresh.types
        );
    }
    assert_eq!(fresh.value("leash_trees_registered_total", &[]), 0.0);
    the_process_figures_are_the_daemons(&fresh, daemon.pid(), started);

    // A tree of one process, under a host's lease: on the gauges.
    let mut host = daemon.client();
    let tree = LeashedTree::spawn(
        &mut host,
        "metrics-killed",
        "sleep",
        &["1000"],
        &TreeOptions::default(),
    );
    let live = scrape_until(&socket, "the tree and its member", |text| {
        sample(text, "leash_trees") == Some(1.0) && sample(text, "leash_members") == Some(1.0)
    });
    let live = parse_and_lint(&python, &live);
    assert_eq!(live.value("leash_leases", &[]), 1.0, "the host's lease");
    assert_eq!(live.value("leash_trees_registered_total", &[]), 1.0);

    // Killed on request, with no grace.
    host.kill(tree.tree, Some(Duration::ZERO)).unwrap();
    drop(tree);
    // Killed because its root exited.
    a_tree_whose_root_exits(&daemon);
    // Killed because its host's connection closed.
    {
        let mut other_host = daemon.client();
        let orphan = LeashedTree::spawn(
            &mut other_host,
            "metrics-host-gone",
            "sleep",
            &["1000"],
            &TreeOptions::default(),
        );
        // In its cgroup first: until the root has joined it, the cgroup reads empty, the wait
        // below would end at once, and the tree's drop would kill the root before the daemon
        // saw the connection close (a kill for root_exited, not lease_ended).
        orphan.cgroup.settle(1, &["sleep"]);
        drop(other_host);
        assert!(
            wait_for(PATIENCE, || !orphan.cgroup.populated()),
            "the tree of a host that went away was not killed"
        );
    }

    // Refusals: a line that is not JSON, a token that names no lease, a tree that does not
    // exist, and an unprivileged user registering root's process.
    let refused = speak(&daemon.socket, "not json\n");
    assert_eq!(refused["error"]["code"], "bad_request", "{refused}");
    let roots = Cgroup::new("metrics-roots-process");
    let mut sleeper = roots.command("sleep", &["1000"]).spawn().unwrap();
    roots.settle(1, &["sleep"]);
    let bogus = format!(
        "{{\"id\":1,\"op\":\"register\",\"pid\":{},\"lease\":\"{}\"}}\n",
        sleeper.id(),
        "0".repeat(32)
    );
    let refused = speak(&daemon.socket, &bogus);
    assert_eq!(refused["error"]["code"], "not_found", "{refused}");
    assert!(host.kill(999_999, None).is_err(), "no tree 999999");
    let register = format!(
        r#"
import json, socket
s = socket.socket(socket.AF_UNIX)
s.connect({:?})
s.sendall(json.dumps({{"id": 1, "op": "register", "pid": {}}}).encode() + b"\n")
print(s.makefile().readline().strip())
"#,
        path_str(&daemon.socket),
        sleeper.id()
    );
    let mut as_user = setpriv_args(USER_A);
    as_user.extend(["/usr/bin/python3".to_owned(), "-c".to_owned(), register]);
    let output = Command::new("setpriv")
        .args(&as_user)
        .current_dir("/")
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert_eq!(reply["error"]["code"], "permission_denied", "{reply}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    // Three kills done (the reading may lag a second behind), and nothing left.
    let done = scrape_until(
        &socket,
        "three kills, no tree, the first host's lease",
        |text| {
            sample(text, "leash_kill_duration_seconds_count") == Some(3.0)
                && sample(text, "leash_trees") == Some(0.0)
                && sample(text, "leash_leases") == Some(1.0)
                && sample(
                    text,
                    r#"leash_requests_refused_total{code="permission_denied"}"#,
                ) == Some(1.0)
        },
    );
    let done = parse_and_lint(&python, &done);
    let kills = |reason| done.value("leash_kills_total", &[("reason", reason)]);
    assert_eq!(kills("request"), 1.0);
    assert_eq!(kills("root_exited"), 1.0);
    assert_eq!(kills("lease_ended"), 1.0);
    for reason in [
        "untrackable",
        "member_quota",
        "enclosing_killed",
        "shutdown",
        "resumed",
    ] {
        assert_eq!(kills(reason), 0.0, "{reason}");
    }
    assert_eq!(done.value("leash_kill_failures_total", &[]), 0.0);
    let refusals = |code| done.value("leash_requests_refused_total", &[("code", code)]);
    assert_eq!(refusals("bad_request"), 1.0);
    assert_eq!(refusals("not_found"), 2.0);
    assert_eq!(refusals("permission_denied"), 1.0);
    for code in [
        "too_long",
        "unsupported_version",
        "limit_reached",
        "kill_failed",
        "internal",
    ] {
        assert_eq!(refusals(code), 0.0, "{code}");
    }
    // The histogram: every kill in a bucket, the sum their time, which is under a minute each.
    let bucket = |le| done.value("leash_kill_duration_seconds_bucket", &[("le", le)]);
    assert_eq!(bucket("+Inf"), 3.0);
    assert!(bucket("0.001") <= bucket("1") && bucket("1") <= bucket("+Inf"));
    let sum = done.value("leash_kill_duration_seconds_sum", &[]);
    assert!(sum > 0.0 && sum < 180.0, "{sum}");
    assert_eq!(done.value("leash_members", &[]), 0.0);
    // Three trees registered (one by `leash run`), none of the refused requests.
    assert_eq!(done.value("leash_trees_registered_total", &[]), 3.0);
    // No subscriber, and the maps were never full.
    assert_eq!(done.value("leash_events_dropped_total", &[]), 0.0);
    assert_eq!(done.value("leash_member_inserts_failed_total", &[]), 0.0);
    assert_eq!(done.value("leash_kernel_events_dropped_total", &[]), 0.0);
    // Every program's skips, whatever this kernel makes of them (some on 7.x).
    for program in leash::kernel::programs::of_layer(leash::kernel::Layer::Tracking) {
        let program = program.name;
        let skips = done.value("leash_program_skips_total", &[("program", program)]);
        assert!(skips >= 0.0, "{program}: {skips}");
    }

    // The endpoint's other answers.
    let other_path = exchange(unix(&socket), "GET / HTTP/1.1\r\n\r\n");
    assert_eq!(other_path.status, 404, "{}", other_path.head);
    let other_method = exchange(unix(&socket), "POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(other_method.status, 405, "{}", other_method.head);
    let broken = exchange(unix(&socket), "\x00\x01 nonsense\r\n\r\n");
    assert_eq!(broken.status, 400, "{}", broken.head);
    let head = exchange(unix(&socket), "HEAD /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(head.status, 200, "{}", head.head);
    assert!(head.body.is_empty());
    // A clean stop removes the socket.
    drop(host);
    let mut daemon = daemon;
    assert!(daemon.stop(), "the daemon stopped cleanly");
    assert!(
        !socket.exists(),
        "the metrics socket is removed when the daemon stops"
    );
}

/// The `process_*` figures of a scrape are those of the daemon's process `pid`, started at
/// `started` (give or take the clock's tick), as /proc shows it now.
fn the_process_figures_are_the_daemons(parsed: &Parsed, pid: u32, started: SystemTime) {
    let proc_file = |name: &str| {
        fs::read_to_string(format!("/proc/{pid}/{name}"))
            .unwrap_or_else(|e| panic!("reading /proc/{pid}/{name}: {e}"))
    };
    let status = proc_file("status");
    let vm_rss_kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    let vm_rss = vm_rss_kib * 1024.0;
    let rss = parsed.value("process_resident_memory_bytes", &[]);
    // Read a moment apart (a reading is served for up to a second), by a daemon at work: close,
    // not equal.
    assert!(
        rss > 0.0 && (rss - vm_rss).abs() <= (vm_rss * 0.2).max(4.0 * 1024.0 * 1024.0),
        "process_resident_memory_bytes {rss}, but /proc/{pid}/status says VmRSS {vm_rss}"
    );
    assert!(parsed.value("process_virtual_memory_bytes", &[]) >= rss);
    // Loading the programs alone takes CPU time.
    let cpu = parsed.value("process_cpu_seconds_total", &[]);
    assert!(cpu > 0.0 && cpu < 600.0, "{cpu}");
    let soft_limit: f64 = proc_file("limits")
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
        .expect("Max open files in /proc/PID/limits");
    assert_eq!(parsed.value("process_max_fds", &[]), soft_limit);
    let open_fds = parsed.value("process_open_fds", &[]);
    let now_open = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as f64;
    // Its BPF objects, sockets and log at least; a connection or so more or less now.
    assert!(
        open_fds >= 5.0 && (open_fds - now_open).abs() <= 4.0,
        "process_open_fds {open_fds}, and /proc/{pid}/fd has {now_open}"
    );
    let since_epoch = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let start = parsed.value("process_start_time_seconds", &[]);
    assert!(
        start >= since_epoch(started) - 2.0 && start <= since_epoch(SystemTime::now()) + 1.0,
        "process_start_time_seconds {start}: the daemon started at {}",
        since_epoch(started)
    );
}

/// Where the daemon's log says it serves the metrics over TCP.
fn tcp_address(daemon: &Daemon) -> SocketAddr {
    const SAID: &str = "metrics served on ";
    let mut found = None;
    let said = wait_for(PATIENCE, || {
        found = daemon.log().lines().find_map(|line| {
            let at = &line[line.find(SAID)? + SAID.len()..];
            let end = at.find(|c: char| c.is_whitespace() || c == '\x1b');
            at[..end.unwrap_or(at.len())].parse::<SocketAddr>().ok()
        });
        found.is_some()
    });
    assert!(said, "no address in the log:\n{}", daemon.log());
    found.unwrap()
}

#[test]
fn a_loopback_port_serves_the_same() {
    let Some(python) = parser_python() else {
        return;
    };
    // Port 0: the kernel picks a free one, and the daemon logs it.
    let Some(daemon) = Daemon::start(&["--metrics", "127.0.0.1:0", "--max-trees", "77"]) else {
        return;
    };
    let addr = tcp_address(&daemon);
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let parsed = parse_and_lint(&python, &scrape_tcp(addr));
    assert_eq!(parsed.value("leash_trees_capacity", &[]), 77.0);
    assert_eq!(parsed.value("leash_trees", &[]), 0.0);
    // That port is taken now: a second daemon asking for it is refused before it loads
    // anything.
    let second = daemon.dir.join("second.sock");
    let output = Command::new(leash_binary())
        .args(["--socket", path_str(&second), "daemon", "--no-pin"])
        .args(["--metrics", &addr.to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!("binding --metrics {addr}")) && stderr.contains("in use"),
        "{stderr}"
    );
    assert!(!second.exists(), "the refused daemon left its socket");
}

#[test]
fn endpoints_that_are_not_loopback_or_are_taken_are_refused() {
    let dir = SocketDir::new();
    let socket = dir.socket();
    let Some(daemon) = Daemon::start(&["--metrics", path_str(&socket)]) else {
        return;
    };
    let second = daemon.dir.join("second.sock");
    let start_second = |metrics: &str| {
        let output = Command::new(leash_binary())
            .args(["--socket", path_str(&second), "daemon", "--no-pin"])
            .args(["--metrics", metrics])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{metrics} was accepted");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = start_second(path_str(&socket));
    assert!(said.contains("another leash daemon is serving"), "{said}");
    assert!(said.contains("--metrics"), "{said}");
    for open in ["0.0.0.0:9464", "[::]:9464"] {
        let said = start_second(open);
        assert!(
            said.contains("not a loopback address") && said.contains("no authentication"),
            "{said}"
        );
    }
    let said = start_second("metrics.sock");
    assert!(said.contains("neither an absolute path"), "{said}");
    // A group restricts a socket's file; nothing restricts who connects to a port.
    let with_group = |metrics: &str, group: &str| {
        let output = Command::new(leash_binary())
            .args(["--socket", path_str(&second), "daemon", "--no-pin"])
            .args(["--metrics", metrics, "--metrics-group", group])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{metrics} {group} was accepted");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = with_group("127.0.0.1:0", "0");
    assert!(said.contains("applies to a Unix socket"), "{said}");
    let other = dir.0.join("other.sock");
    let said = with_group(path_str(&other), "no-such-group-of-leash");
    assert!(said.contains("no such group"), "{said}");
    // The first daemon's endpoint is untouched.
    assert!(scrape(&socket).contains("\nleash_trees 0\n"));
}

#[test]
fn idle_and_junk_clients_stop_neither_scrapes_nor_enforcement() {
    let dir = SocketDir::new();
    let socket = dir.socket();
    let Some(daemon) = Daemon::start(&["--metrics", path_str(&socket)]) else {
        return;
    };
    // Clients that connect and send nothing (slowloris), and one that half-sends a head.
    let idle: Vec<UnixStream> = (0..4).map(|_| unix(&socket)).collect();
    let mut partial = unix(&socket);
    partial.write_all(b"GET /metrics HTTP/1.1\r\nX: ").unwrap();
    // A client that sends 1 MiB of junk with no end of head.
    let junk_client = unix(&socket);
    junk_client
        .set_write_timeout(Some(PATIENCE))
        .expect("a write timeout");
    let junk = thread::spawn(move || {
        let mut stream = junk_client;
        let junk = vec![b'x'; 1 << 20];
        let sent = stream.write_all(&junk);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        (sent, String::from_utf8_lossy(&answer).into_owned())
    });

    // Meanwhile a scrape is answered, while the idle clients are still connected (they are
    // dropped after 5 s: a scrape takes milliseconds).
    assert!(scrape(&socket).contains("\nleash_trees "));
    for stream in &idle {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8];
        let read = (&*stream).read(&mut byte);
        assert!(
            matches!(&read, Err(e) if e.kind() == ErrorKind::WouldBlock),
            "an idle client was already answered or closed ({read:?}), so the scrapes did not \
             overlap it"
        );
        stream.set_nonblocking(false).unwrap();
    }
    // And the daemon enforces: a tree whose root exits dies.
    a_tree_whose_root_exits(&daemon);

    // The junk was cut off at the head limit and answered, not read to its end.
    let (sent, answer) = junk.join().unwrap();
    assert!(
        sent.is_err(),
        "the endpoint took all 1 MiB of a request head with no end"
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431 "),
        "{answer}"
    );
    // The idle clients are dropped once their time is up (5 s), the partial one too.
    for mut stream in idle.into_iter().chain([partial]) {
        let mut rest = Vec::new();
        let read = stream.read_to_end(&mut rest);
        assert!(
            matches!(read, Ok(0)),
            "an idle client was not closed: {read:?} {rest:?}"
        );
    }
    // And scrapes go on.
    assert!(scrape(&socket).contains("\nleash_trees "));
}

/// argv: SOCKET. Connects to the metrics socket and prints the status line of a scrape, or
/// `refused ERRNO` if the connection is not allowed.
const SCRAPE_AS: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("refused", e.errno)
    sys.exit()
s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
print(s.makefile("rb").readline().decode().strip())
"#;

/// What a scrape of `socket` by `uid`, with the supplementary `groups`, gets: the status line,
/// or `refused ERRNO`.
fn scrape_as(socket: &Path, uid: u32, groups: &[u32]) -> String {
    let mut args = setpriv_args(uid);
    if !groups.is_empty() {
        let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
        args.retain(|a| a != "--clear-groups");
        args.push(format!("--groups={}", groups.join(",")));
    }
    args.extend(["/usr/bin/python3", "-c", SCRAPE_AS, path_str(socket)].map(String::from));
    let output = Command::new("setpriv")
        .args(&args)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A local user who may connect to the metrics socket may also hold its few connections and
/// keep the scraper out (1000 connections did): so the socket is root's alone, 0600, or root's
/// and a named group's, 0660, for the scraper's user. Before, it was 0666.
#[test]
fn the_metrics_socket_is_roots_or_its_groups_alone() {
    const SCRAPERS: u32 = 61050;
    let dir = SocketDir::new();
    let socket = dir.socket();
    let mode = |path: &Path| {
        let meta = fs::metadata(path).unwrap();
        use std::os::unix::fs::MetadataExt;
        (meta.mode() & 0o777, meta.uid(), meta.gid())
    };
    {
        let Some(_daemon) = Daemon::start(&["--metrics", path_str(&socket)]) else {
            return;
        };
        assert_eq!(mode(&socket), (0o600, 0, 0), "root's alone by default");
        assert_eq!(scrape_as(&socket, USER_A, &[]), "refused 13");
        assert_eq!(scrape_as(&socket, USER_A, &[SCRAPERS]), "refused 13");
        assert!(scrape(&socket).contains("\nleash_trees "), "root scrapes");
    }
    // As the unit runs it: without CAP_CHOWN, in the group (SupplementaryGroups=), and with
    // its LimitMEMLOCK= (kernels before 5.11 charge the maps to it, and without
    // CAP_SYS_RESOURCE the daemon cannot raise it itself).
    let group = SCRAPERS.to_string();
    let memlock = format!("--memlock={}", settable_limit(None, libc::RLIMIT_MEMLOCK));
    let wrapper = [
        "prlimit",
        &memlock,
        "--",
        "setpriv",
        "--bounding-set=-all,+bpf,+perfmon,+sys_admin,+kill",
        "--inh-caps=-all",
        &format!("--groups={group}"),
    ];
    let args = ["--metrics", path_str(&socket), "--metrics-group", &group];
    let Some(_daemon) = Daemon::start_wrapped(&wrapper, &args) else {
        return;
    };
    assert_eq!(
        mode(&socket),
        (0o660, 0, SCRAPERS),
        "root's and the group's"
    );
    assert_eq!(scrape_as(&socket, USER_A, &[SCRAPERS]), "HTTP/1.1 200 OK");
    assert_eq!(scrape_as(&socket, USER_A, &[]), "refused 13");
    assert!(scrape(&socket).contains("\nleash_trees "), "root scrapes");
}
