//! The Node.js host library (clients/node) against the real daemon: runs its node:test suites,
//! clients/node/test/*.test.js, with `node --test`, as root. They get a daemon of their own, a
//! second one with a small tree limit, an unprivileged uid to run hosts as, and a copy of the
//! package that every user may read. Everything they start runs inside a cgroup of this test's,
//! killed and removed however they end.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup, Removed, SKIP_HOSTS_VAR, copy_readable,
    daemon::{Daemon, USER_A},
    hosts_cache, hosts_skipped, on_path, wait_for, workspace_root,
};

/// The tree limit of the second daemon, for the tests of a refused spawn.
const MAX_TREES: &str = "2";
/// For the whole suite: each test awaits its conditions with deadlines of its own.
const SUITE_DEADLINE: Duration = Duration::from_secs(20 * 60);

#[test]
fn the_node_host_library_passes_its_tests_against_the_real_daemon() {
    if hosts_skipped("Node.js host library's") {
        return;
    }
    let node = Node::find();
    let mut command = Command::new(&node.path);
    command.arg("--test");
    if node.major >= 20 {
        command.arg("--test-reporter=spec");
    }
    run_suites("node", &node.version, command, |_| true);
}

/// The same suites on Bun (`bun test` runs node:test suites): LEASH_TEST_BUN, the npm package
/// `bun` in the hosts' cache (`cargo xtask test` installs it), or `bun` on PATH. The Claude
/// Agent SDK's test runs on Node only.
#[test]
fn the_node_host_library_passes_its_tests_on_bun() {
    if hosts_skipped("Node.js host library's") {
        return;
    }
    let Some(bun) = find_bun() else {
        panic!(
            "no Bun (LEASH_TEST_BUN, {}, or `bun` on PATH): run `cargo xtask test`, which \
             installs it, or set {SKIP_HOSTS_VAR}=1 to leave the host libraries' tests out",
            hosts_cache().join("node_modules/.bin/bun").display()
        );
    };
    let version = Command::new(&bun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|e| panic!("running {} --version: {e}", bun.display()));
    let mut command = Command::new(&bun);
    // Bun's default is 5 s a test; the tests keep deadlines of their own.
    command.args(["test", "--timeout", "300000"]);
    run_suites("bun", &format!("Bun {version}"), command, |name| {
        !name.starts_with("claude")
    });
}

/// Runs `runner` on the test files `wanted` keeps, against fresh daemons, inside a cgroup of
/// its own, and asserts that they pass.
fn run_suites(label: &str, version: &str, runner: Command, wanted: impl Fn(&str) -> bool) {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let Some(limited) = Daemon::start(&["--max-trees-per-uid", MAX_TREES]) else {
        return;
    };
    // The hosts run as USER_A, who may not read the clone.
    let package = daemon.dir.join("clients-node");
    copy_readable(&workspace_root().join("clients/node"), &package);
    let tests = test_files(&package.join("test"), wanted);
    // Where the tests pin the daemons they run themselves; declared first, so removed last,
    // after the cgroups (and whatever was left in them).
    let pins = Removed(PathBuf::from(format!(
        "/sys/fs/bpf/leash-node-tests-{label}-{}",
        std::process::id()
    )));
    let groups = Cgroup::new(&format!("node-tests-{label}"));
    let log = daemon.dir.join("node-test.log");
    let log_file = fs::File::create(&log).unwrap();
    let program = runner.get_program().to_str().expect("a UTF-8 path");
    let mut command = groups.command(program, &[]);
    command
        .args(runner.get_args())
        .args(&tests)
        .current_dir(&package)
        .env("LEASH_SOCKET", &daemon.socket)
        .env("LEASH_BIN", daemon.leash_for_anyone())
        .env("LEASH_TEST_USER", USER_A.to_string())
        .env("LEASH_TEST_LIMITED_SOCKET", &limited.socket)
        .env("LEASH_TEST_MAX_TREES", MAX_TREES)
        .env(
            "LEASH_TEST_NODE_MODULES",
            hosts_cache().join("node_modules"),
        )
        .env("LEASH_TEST_CGROUP_PARENT", groups.path())
        .env("LEASH_TEST_PIN_ROOT", &pins.0)
        .env_remove("LEASH_LEASE")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        // A group of its own, to stop the runner and its per-file processes if time runs out.
        .process_group(0);
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {label}: {e}"));
    let finished = wait_for(SUITE_DEADLINE, || child.try_wait().unwrap().is_some());
    if !finished {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
    }
    let status = child.wait().unwrap();
    let output = fs::read_to_string(&log).unwrap_or_default();
    println!(
        "{label}: {} suites ({version}, {:.1} s):\n{output}",
        tests.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        finished,
        "the {label} tests did not finish in {SUITE_DEADLINE:?}:\n{output}"
    );
    assert!(
        status.success(),
        "the {label} tests failed ({status}):\n{output}"
    );
}

fn find_bun() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LEASH_TEST_BUN") {
        return Some(path.into());
    }
    let cached = hosts_cache().join("node_modules/.bin/bun");
    if cached.is_file() {
        return Some(cached);
    }
    on_path("bun")
}

struct Node {
    path: PathBuf,
    version: String,
    major: u32,
}

impl Node {
    /// `node` on PATH, 18 or later, or a failure that says how to get it.
    fn find() -> Self {
        let how = format!(
            "the Node.js host library's tests need Node.js 18 or later: `cargo xtask test` \
             installs it (apt-get install nodejs), or set {SKIP_HOSTS_VAR}=1 to leave them out"
        );
        let path = on_path("node").unwrap_or_else(|| panic!("no `node` on PATH: {how}"));
        let output = Command::new(&path)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("running {} --version: {e}: {how}", path.display()));
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let major = version
            .trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        assert!(
            major >= 18,
            "{} is Node.js {version}: {how}",
            path.display()
        );
        Self {
            path,
            version,
            major,
        }
    }
}

/// The suites, listed (node 18 and 20 take no glob, and differ on directories).
fn test_files(dir: &Path, wanted: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".test.js") && wanted(n))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.test.js in {}", dir.display());
    files
}
