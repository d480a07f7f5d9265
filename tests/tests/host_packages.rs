//! The host libraries as a host author installs them: the packages `cargo xtask packages` makes
//! (a platform wheel and the npm tarballs that carry a `leash` binary, and the pure wheel),
//! installed into a fresh virtual environment and a fresh npm directory, with no `leash` on
//! PATH and no LEASH_BIN. A host spawns a tree through the library, which finds the packaged
//! binary; the host is SIGKILLed and the tree (a cgroup v2 group, the ground truth) is gone.
//!
//! The packages are made by the xtask binary itself (`xtask packages --binary`), so that the
//! test installs what a release would hold, made the same way; around this build's own
//! `leash` (stripped of its debug information, for speed), since `cargo xtask dist` is minutes
//! of zig. No registry is asked: the npm install is `--offline`, the wheels install with
//! `--no-index`.
//!
//! And the shim's version check: a packaged binary comes ahead of PATH and may meet a daemon of
//! another release; `leash exec` then fails naming both.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, net::UnixListener},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::mpsc::Receiver,
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup, SKIP_HOSTS_VAR, daemon::Daemon, hosts_skipped, leash_binary, on_path, read_lines,
    workspace_root,
};

/// The directories a host's PATH holds here: the system's, with no `leash` in them.
const HOST_PATH: &str = "/usr/bin:/bin";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const DEADLINE: Duration = Duration::from_secs(30);

/// A directory of the test's own, removed however the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Self {
        let path = PathBuf::from(format!(
            "/tmp/leash-packages-{label}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A host process, SIGKILLed and reaped however the test ends.
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A Python host: prints the binary the library found and the tree it started, then waits to
/// be killed.
const PYTHON_HOST: &str = r#"
import json, sys, leash
from leash import _shim
lease = leash.Lease()
child = lease.popen(sys.argv[1:])
print(json.dumps({"leash": _shim.find_leash(None), "tree": child.leash_tree}), flush=True)
sys.stdin.read()
"#;

/// The same in Node, as an ES module beside node_modules. The binary found is asked of the
/// installed library's own module (by path: the package exports only its index).
const NODE_HOST: &str = r#"
import { Lease } from "leash-client";
const { leashBinary } = await import(new URL("./node_modules/leash-client/src/locate.js", import.meta.url));
const lease = await Lease.connect();
const child = lease.spawn(process.argv[2], process.argv.slice(3), { stdio: ["ignore", "ignore", "inherit"] });
const tree = await lease.treeOfLeashed(child);
console.log(JSON.stringify({ leash: leashBinary(), tree }));
setInterval(() => {}, 1 << 30);
"#;

/// A Python host on the pure wheel: spawns `true` and says what it found.
const PURE_HOST: &str = r#"
import json, leash
from leash import _shim
with leash.Lease() as lease:
    child = lease.popen(["true"])
    print(json.dumps({"leash": _shim.find_leash(None), "tree": child.leash_tree, "exit": child.wait()}))
"#;

#[test]
fn packaged_binaries_serve_hosts_with_no_leash_on_path() {
    if hosts_skipped("host packages'") {
        return;
    }
    for dir in HOST_PATH.split(':') {
        let found = Path::new(dir).join("leash");
        assert!(
            !found.exists(),
            "{} exists: the hosts here must find no leash on PATH ({HOST_PATH})",
            found.display()
        );
    }
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let started = Instant::now();
    let scratch = Scratch::new("hosts");
    let packages = make_packages(&scratch.0);
    eprintln!("packages made in {:.1} s", started.elapsed().as_secs_f64());

    // Python: the platform wheel, in a fresh virtual environment.
    let venv = scratch.0.join("venv-platform");
    let python = install_wheel(&venv, &packages.platform_wheel);
    let packaged = site_packages(&venv).join("leash/_bin/leash");
    assert_executable(&packaged);
    let cgroup = Cgroup::new("packaged-python");
    let mut command = Command::new(&python);
    command.args(["-c", PYTHON_HOST]);
    let said = host_dies_and_its_tree_with_it(&daemon, command, &cgroup, "python");
    assert_eq!(
        said["leash"].as_str(),
        Some(packaged.to_str().unwrap()),
        "{said}"
    );
    eprintln!(
        "python host done at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Node: the leash-client tarball and the platform one, in a fresh npm directory.
    let node = on_path("node").unwrap_or_else(|| {
        panic!("no node on PATH: install Node.js 18 or later, or set {SKIP_HOSTS_VAR}=1")
    });
    let npm_dir = scratch.0.join("npm");
    fs::create_dir(&npm_dir).unwrap();
    run(Command::new("npm")
        .args([
            "install",
            "--offline",
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--prefix",
        ])
        .arg(&npm_dir)
        .arg(&packages.npm_main)
        .arg(&packages.npm_platform));
    let packaged = npm_dir.join(format!(
        "node_modules/leash-client-linux-{}/bin/leash",
        npm_cpu()
    ));
    assert_executable(&packaged);
    fs::write(npm_dir.join("host.mjs"), NODE_HOST).unwrap();
    let cgroup = Cgroup::new("packaged-node");
    let mut command = Command::new(node);
    command.arg(npm_dir.join("host.mjs")).current_dir(&npm_dir);
    let said = host_dies_and_its_tree_with_it(&daemon, command, &cgroup, "node");
    assert_eq!(
        said["leash"].as_str(),
        Some(packaged.to_str().unwrap()),
        "{said}"
    );
    eprintln!("node host done at {:.1} s", started.elapsed().as_secs_f64());

    // The pure wheel carries no binary and finds the one on PATH.
    let venv = scratch.0.join("venv-pure");
    let python = install_wheel(&venv, &packages.pure_wheel);
    assert!(!site_packages(&venv).join("leash/_bin").exists());
    let bin = scratch.0.join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(leash_binary(), bin.join("leash")).unwrap();
    let output = run(Command::new(&python)
        .args(["-c", PURE_HOST])
        .env_clear()
        .env("PATH", format!("{}:{HOST_PATH}", bin.display()))
        .env("LEASH_SOCKET", &daemon.socket)
        .env("PYTHONDONTWRITEBYTECODE", "1"));
    let said: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(said["leash"].as_str(), bin.join("leash").to_str(), "{said}");
    assert!(said["tree"].is_u64(), "{said}");
    assert_eq!(said["exit"], 0, "{said}");
    eprintln!("all done in {:.1} s", started.elapsed().as_secs_f64());
}

/// What `xtask packages` made.
struct Packages {
    pure_wheel: PathBuf,
    platform_wheel: PathBuf,
    npm_main: PathBuf,
    npm_platform: PathBuf,
}

/// Runs the xtask binary (built by `cargo xtask test`, beside this build's `leash`) to pack
/// this build's `leash`, stripped of its debug information (a hundred megabytes packed twice
/// would be most of the test's time).
fn make_packages(scratch: &Path) -> Packages {
    let xtask = leash_binary().with_file_name("xtask");
    assert!(
        xtask.is_file(),
        "no {}: run the tests through `cargo xtask test`, which builds it",
        xtask.display()
    );
    let binary = scratch.join("leash");
    run(Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&binary)
        .arg(leash_binary()));
    let out = scratch.join("packages");
    let output = run(Command::new(&xtask)
        .arg("packages")
        .arg("--binary")
        .arg(&binary)
        .arg("--out")
        .arg(&out));
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));
    let find = |matches: &dyn Fn(&str) -> bool, what: &str| -> PathBuf {
        let found: Vec<PathBuf> = fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| matches(p.file_name().unwrap().to_str().unwrap()))
            .collect();
        assert_eq!(found.len(), 1, "{what} in {}: {found:?}", out.display());
        found[0].clone()
    };
    let arch = std::env::consts::ARCH;
    let platform_suffix = format!("_{arch}.whl");
    let npm_platform = format!("leash-client-linux-{}-{VERSION}.tgz", npm_cpu());
    Packages {
        pure_wheel: find(&|n| n.ends_with("-py3-none-any.whl"), "the pure wheel"),
        platform_wheel: find(
            &|n| n.contains("-py3-none-manylinux_") && n.ends_with(&platform_suffix),
            "the platform wheel",
        ),
        npm_main: find(
            &|n| n == format!("leash-client-{VERSION}.tgz"),
            "leash-client",
        ),
        npm_platform: find(&|n| n == npm_platform, "the platform package"),
    }
}

/// As Node's `process.arch` names this machine.
fn npm_cpu() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => panic!("leash is not packaged for {other}"),
    }
}

/// A fresh virtual environment of the system's Python with `wheel` installed (by the hosts'
/// environment's pip: no index, no pip in the new one); returns its interpreter.
fn install_wheel(venv: &Path, wheel: &Path) -> PathBuf {
    run(Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(venv));
    let python = venv.join("bin/python");
    let pip = workspace_root().join("target/hosts/python/bin/python");
    assert!(
        pip.is_file(),
        "no {}: run `cargo xtask test`, which makes it (or set {SKIP_HOSTS_VAR}=1)",
        pip.display()
    );
    run(Command::new(pip)
        .args(["-m", "pip", "--python"])
        .arg(&python)
        .args([
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(wheel));
    python
}

fn site_packages(venv: &Path) -> PathBuf {
    fs::read_dir(venv.join("lib"))
        .unwrap()
        .map(|e| e.unwrap().path().join("site-packages"))
        .find(|p| p.is_dir())
        .unwrap_or_else(|| panic!("no site-packages in {}", venv.display()))
}

fn assert_executable(path: &Path) {
    let mode = fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "{} has mode {mode:o}", path.display());
}

/// Runs `command` (a host) with PATH of the system only and the daemon's socket, its argv
/// ending with a `sleep` in `cgroup`; waits for the line it prints and for the sleep; SIGKILLs
/// the host and waits for the group to empty. Returns the host's line.
fn host_dies_and_its_tree_with_it(
    daemon: &Daemon,
    mut command: Command,
    cgroup: &Cgroup,
    label: &str,
) -> serde_json::Value {
    command
        .args(cgroup.argv("sleep", &["600"]))
        .env_clear()
        .env("PATH", HOST_PATH)
        .env("LEASH_SOCKET", &daemon.socket)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut host = Host(command.spawn().unwrap());
    let lines: Receiver<String> = read_lines(&mut host.0);
    let line = lines
        .recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("the {label} host said nothing (its stderr is above)"));
    let said: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert!(said["tree"].is_u64(), "{label}: {said}");
    cgroup.settle_exactly(&["sleep"]);
    host.0.kill().unwrap();
    host.0.wait().unwrap();
    assert!(
        cgroup.wait_empty(DEADLINE).is_some(),
        "the {label} host was SIGKILLed and its tree lives on: {:?}\n{}",
        cgroup.procs(),
        daemon.log()
    );
    said
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A daemon of another release, faked: it refuses `hello` as a daemon of protocol 2 does.
/// `leash exec` fails naming its own version and protocol and the daemon's.
#[test]
fn the_shim_names_both_versions_when_the_daemon_speaks_another_protocol() {
    let scratch = Scratch::new("version");
    let socket = scratch.0.join("other.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let fake = std::thread::spawn(move || -> Option<serde_json::Value> {
        let deadline = Instant::now() + DEADLINE;
        let stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return None,
            }
        };
        stream.set_nonblocking(false).unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        let hello: serde_json::Value = serde_json::from_str(&line).unwrap();
        let refusal = serde_json::json!({
            "id": hello["id"],
            "error": {
                "code": "unsupported_version",
                "message": format!("this daemon (leash 9.8.7) speaks protocol 2, not {}", hello["protocol"]),
            },
        });
        writeln!(&stream, "{refusal}").unwrap();
        Some(hello)
    });
    let output = Command::new(leash_binary())
        .arg("--socket")
        .arg(&socket)
        .args(["exec", "--", "true"])
        .env("LEASH_LEASE", "0123456789abcdef0123456789abcdef")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let hello = fake.join().unwrap().expect("leash exec never connected");
    assert_eq!(hello["op"], "hello");
    assert_eq!(hello["protocol"], 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("leash exec said: {stderr}");
    assert!(!output.status.success(), "{stderr}");
    for words in [
        format!("this leash ({VERSION}, {}", leash_binary().display()),
        ") speaks protocol 1".to_owned(),
        "this daemon (leash 9.8.7) speaks protocol 2, not 1".to_owned(),
        "unsupported_version".to_owned(),
        "LEASH_BIN".to_owned(),
    ] {
        assert!(stderr.contains(&words), "{words:?} is not in: {stderr}");
    }
}

/// The real daemon's refusal names its release as well as its protocol.
#[test]
fn the_daemon_refusing_a_protocol_names_its_version() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let stream = std::os::unix::net::UnixStream::connect(&daemon.socket).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    writeln!(&stream, r#"{{"id":1,"op":"hello","protocol":999}}"#).unwrap();
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).unwrap();
    let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(reply["error"]["code"], "unsupported_version", "{reply}");
    assert_eq!(
        reply["error"]["message"],
        format!("this daemon (leash {VERSION}) speaks protocol 1, not 999"),
        "{reply}"
    );
}
