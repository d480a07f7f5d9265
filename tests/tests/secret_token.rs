//! A lease token is a secret: whoever holds it can put processes under the host's lease. The
//! `leash exec` shim takes it on a descriptor or in LEASH_LEASE, never on argv (which every
//! local user can read in /proc/PID/cmdline), and leaves nothing of it to the command: not in
//! its environment, not as an open descriptor. The cgroup is the referee that the tree still
//! dies with the host's lease.

use std::{
    ffi::OsStr,
    fs,
    io::{self, Write},
    os::fd::AsRawFd,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use leash_client::Client;
use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, leash_for_anyone_in, path_str, setpriv_args},
    leash_binary, wait_for,
};

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

fn proc_file(pid: impl std::fmt::Display, name: &str) -> Vec<u8> {
    fs::read(format!("/proc/{pid}/{name}")).unwrap_or_default()
}

/// Every process on the machine whose command line holds `token`.
fn cmdlines_holding(token: &str) -> Vec<(String, String)> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let pid = entry.ok()?.file_name().into_string().ok()?;
            pid.parse::<u32>().ok()?;
            let cmdline = proc_file(&pid, "cmdline");
            contains(&cmdline, token)
                .then(|| (pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
        })
        .collect()
}

/// The open descriptors of `pid`: number and what it names (e.g. `pipe:[1234]`).
fn fds(pid: u32) -> Vec<(i32, PathBuf)> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| {
                let entry = entry.ok()?;
                let fd = entry.file_name().to_str()?.parse().ok()?;
                Some((fd, fs::read_link(entry.path()).ok()?))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The number after `--lease-fd` in `command`'s argv.
fn lease_fd(command: &Command) -> i32 {
    let args: Vec<&OsStr> = command.get_args().collect();
    let at = args
        .iter()
        .position(|a| *a == "--lease-fd")
        .expect("--lease-fd in the shim's argv");
    args[at + 1].to_str().unwrap().parse().unwrap()
}

/// Asserts that no process of `cgroup` has the token in its command line or environment, or
/// has descriptor `fd` open or anything open on `pipe` (what the token came on), and that no
/// process on the machine has the token on its command line.
fn assert_token_left_nowhere(cgroup: &Cgroup, token: &str, fd: i32, pipe: Option<&PathBuf>) {
    let holding = cmdlines_holding(token);
    assert!(
        holding.is_empty(),
        "the token is on a command line: {holding:?}"
    );
    for pid in cgroup.procs() {
        assert!(
            !contains(&proc_file(pid, "cmdline"), token),
            "the token is on {pid}'s command line"
        );
        let environ = proc_file(pid, "environ");
        assert!(!environ.is_empty(), "{pid}'s environment was readable");
        assert!(
            !contains(&environ, token) && !contains(&environ, "LEASH_LEASE="),
            "the token is in {pid}'s environment: {}",
            String::from_utf8_lossy(&environ).replace('\0', " ")
        );
        let open = fds(pid);
        eprintln!(
            "pid {pid} ({:?}) has open: {open:?}",
            leash_tests::comm(pid)
        );
        assert!(
            open.iter()
                .all(|(n, target)| *n != fd && Some(target) != pipe),
            "pid {pid} holds the token's descriptor {fd} ({pipe:?}): {open:?}"
        );
    }
}

/// Drops the host and asserts that its tree dies with the lease.
fn assert_dies_with(host: Client, cgroup: &Cgroup) {
    drop(host);
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    assert!(emptied.is_some(), "the tree outlived its host's lease");
}

/// What a tree under a shim runs: two sleeps, one of them setsid'd.
const TREE: &str = "setsid sleep 600 & exec sleep 600";

#[test]
fn a_token_on_a_pipe_is_on_no_command_line_environment_or_descriptor() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let host = daemon.client();
    let token = host.lease().token.clone();
    let cgroup = Cgroup::new("token-pipe");
    let mut command = host
        .exec_command(leash_binary(), cgroup.argv("sh", &["-c", TREE]))
        .unwrap();
    let fd = lease_fd(&command);
    // The host holds the pipe's read end under the number the child gets it as.
    let pipe = fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
    assert!(pipe.to_string_lossy().starts_with("pipe:"), "{pipe:?}");
    let argv: Vec<&OsStr> = command.get_args().collect();
    assert!(
        !argv.iter().any(|a| contains(a.as_encoded_bytes(), &token)),
        "the token is in the shim's argv: {argv:?}"
    );
    let mut shim = command.spawn().unwrap();
    drop(command);
    cgroup.settle(2, &["sleep"]);
    assert_token_left_nowhere(&cgroup, &token, fd, Some(&pipe));
    assert_eq!(host_trees(&daemon, &host), 1);
    assert_dies_with(host, &cgroup);
    let _ = shim.wait();
}

/// The trees under `host`'s lease, as root sees them.
fn host_trees(daemon: &Daemon, host: &Client) -> usize {
    let lease = host.lease().id;
    daemon
        .client()
        .list()
        .unwrap()
        .iter()
        .filter(|tree| tree.lease == lease)
        .count()
}

/// What a Python host does with `subprocess.Popen(argv, pass_fds=[r])`: the shim is already
/// running and waits for the token while the host writes it; the shim's own command line and
/// environment never hold it either.
#[test]
fn a_shim_waiting_for_its_token_shows_it_nowhere() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let host = daemon.client();
    let token = host.lease().token.clone();
    let cgroup = Cgroup::new("token-wait");
    let (reader, mut writer) = io::pipe().unwrap();
    let pipe = fs::read_link(format!("/proc/self/fd/{}", reader.as_raw_fd())).unwrap();
    let mut command = Command::new(leash_binary());
    let fd = leash_client::sys::pass_fd(&mut command, reader.into()).unwrap();
    let argv = host.exec_argv(leash_binary(), fd, cgroup.argv("sh", &["-c", TREE]));
    command.args(&argv[1..]);
    let mut shim = command.spawn().unwrap();
    drop(command);
    // The shim has exec'd and waits on its descriptor.
    let waiting = wait_for(Duration::from_secs(30), || {
        contains(&proc_file(shim.id(), "cmdline"), "--lease-fd")
            && fds(shim.id()).iter().any(|(n, p)| *n == fd && *p == pipe)
    });
    assert!(waiting, "the shim did not start");
    let cmdline = proc_file(shim.id(), "cmdline");
    assert!(
        !contains(&cmdline, &token),
        "the token is on the shim's command line"
    );
    assert!(!contains(&proc_file(shim.id(), "environ"), &token));
    assert!(
        cgroup.procs().is_empty(),
        "nothing runs before the token came"
    );

    writer.write_all(format!("{token}\n").as_bytes()).unwrap();
    drop(writer);
    cgroup.settle(2, &["sleep"]);
    assert_token_left_nowhere(&cgroup, &token, fd, Some(&pipe));
    assert_eq!(host_trees(&daemon, &host), 1);
    assert_dies_with(host, &cgroup);
    let _ = shim.wait();
}

#[test]
fn a_token_in_leash_lease_works_and_is_removed_from_the_command() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let host = daemon.client();
    let token = host.lease().token.clone();
    let cgroup = Cgroup::new("token-env");
    let mut shim = daemon
        .leash()
        .arg("exec")
        .arg("--")
        .args(cgroup.argv("sh", &["-c", TREE]))
        .env("LEASH_LEASE", &token)
        .spawn()
        .unwrap();
    cgroup.settle(2, &["sleep"]);
    // No descriptor to look for: -1 matches none.
    assert_token_left_nowhere(&cgroup, &token, -1, None);
    assert_eq!(host_trees(&daemon, &host), 1);
    assert_dies_with(host, &cgroup);
    let _ = shim.wait();
}

/// The Python host of docs/PROTOCOL.md, as written there: `hello` for the token, then the shim
/// through `Popen(..., pass_fds=[r])`. The host is SIGKILLed; its tree dies with it.
#[test]
fn a_python_host_passes_the_token_as_documented() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("token-python");
    let host = r#"
import json, os, socket, subprocess, sys
leash, sock, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
f = s.makefile("rw")
f.write(json.dumps({"id": 1, "op": "hello", "protocol": 1}) + "\n")
f.flush()
token = json.loads(f.readline())["ok"]["hello"]["lease"]["token"]
r, w = os.pipe()
os.write(w, token.encode() + b"\n"); os.close(w)
subprocess.Popen([leash, "--socket", sock, "exec", "--lease-fd", str(r), "--", *cmd], pass_fds=[r])
os.close(r)
print(token, r, flush=True)
sys.stdin.read()
"#;
    let mut python = Command::new(leash_tests::python())
        .args(["-c", host])
        .arg(leash_binary())
        .arg(&daemon.socket)
        .args(cgroup.argv("sh", &["-c", TREE]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    io::BufRead::read_line(
        &mut io::BufReader::new(python.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    let (token, fd) = said
        .trim()
        .split_once(' ')
        .expect("the host's token and fd");
    cgroup.settle(2, &["sleep"]);
    assert_token_left_nowhere(&cgroup, token, fd.parse().unwrap(), None);
    assert_eq!(daemon.client().list().unwrap().len(), 1);

    python.kill().unwrap();
    let _ = python.wait();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    assert!(emptied.is_some(), "the tree outlived its Python host");
}

/// A shim given its token in LEASH_LEASE, run as an unprivileged user, waits for a daemon that
/// takes its `hello` and says nothing (a slow registration). Meanwhile any process of that user
/// can read the shim's /proc/PID/environ, which shows the block the shim was started with:
/// unsetenv does not change it, so the shim wipes the value there first. Before, the token was
/// readable there until the shim exec'd its command.
#[test]
fn a_shim_given_leash_lease_wipes_it_from_its_environ_while_it_registers() {
    use std::{
        io::{BufRead, BufReader},
        os::unix::{fs::PermissionsExt, net::UnixListener, process::CommandExt},
    };
    let dir = leash_tests::Removed(PathBuf::from(format!(
        "/tmp/leash-environ-{}",
        std::process::id()
    )));
    fs::create_dir_all(&dir.0).unwrap();
    fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.0.join("slow.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o777)).unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    let shim = Command::new(leash_for_anyone_in(&dir.0))
        .args(["--socket", path_str(&socket), "exec", "--", "true"])
        .env("LEASH_LEASE", token)
        .uid(USER_A)
        .gid(USER_A)
        .current_dir("/")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The shim has its token and is registering: its hello came.
    let (connection, _) = listener.accept().unwrap();
    let mut hello = String::new();
    BufReader::new(&connection).read_line(&mut hello).unwrap();
    assert!(hello.contains("\"hello\""), "{hello}");
    // Read as the shim's own user, as an agent of that user would.
    let environ = Command::new("setpriv")
        .args(setpriv_args(USER_A))
        .arg("cat")
        .arg(format!("/proc/{}/environ", shim.id()))
        .output()
        .unwrap();
    assert!(environ.status.success(), "{environ:?}");
    assert!(
        !environ.stdout.is_empty(),
        "the shim's environment was readable"
    );
    // Only the variable is shown: the rest is the test runner's environment.
    let leash_vars: Vec<String> = environ
        .stdout
        .split(|&b| b == 0)
        .filter(|entry| entry.starts_with(b"LEASH_"))
        .map(|entry| String::from_utf8_lossy(entry).into_owned())
        .collect();
    assert!(
        !contains(&environ.stdout, token),
        "the token is in the waiting shim's environment: {leash_vars:?}"
    );
    // No daemon after all: the shim gives up, saying so, and its command never runs.
    drop(connection);
    let gave_up = shim.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&gave_up.stderr);
    assert_eq!(gave_up.status.code(), Some(125), "{said}");
    assert!(said.contains("closed"), "{said}");
}
