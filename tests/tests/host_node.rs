//! The Node.js host library (clients/node) against the real daemon: runs its node:test suites,
//! clients/node/test/*.test.js, with `node --test`, as root. They get a daemon of their own, a
//! second one with a small tree limit, an unprivileged uid to run hosts as, and a copy of the
//! package that every user may read. Everything they start runs inside a cgroup of this test's,
//! killed and removed however they end.

use std::{
    fs,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use leash_tests::{
    cgroup2_root,
    daemon::{Daemon, USER_A},
    wait_for,
};

/// Set to 1 (by `cargo xtask test` on a machine without Node.js) to leave these tests out.
const SKIP_VAR: &str = "LEASH_TEST_SKIP_HOSTS";
/// The tree limit of the second daemon, for the tests of a refused spawn.
const MAX_TREES: &str = "2";
/// For the whole suite: each test awaits its conditions with deadlines of its own.
const SUITE_DEADLINE: Duration = Duration::from_secs(20 * 60);

#[test]
fn the_node_host_library_passes_its_tests_against_the_real_daemon() {
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: {SKIP_VAR}=1: the Node.js host library's tests are left out");
        return;
    }
    let node = Node::find();
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let Some(limited) = Daemon::start(&["--max-trees-per-uid", MAX_TREES]) else {
        return;
    };
    // The hosts run as USER_A, who may not read the clone.
    let package = daemon.dir.join("clients-node");
    copy_readable(&workspace().join("clients/node"), &package);
    let tests = test_files(&package.join("test"));
    let groups = CgroupTree::new();
    let log = daemon.dir.join("node-test.log");

    let mut command = groups.command(&node.path);
    command.arg("--test");
    if node.major >= 20 {
        command.arg("--test-reporter=spec");
    }
    let log_file = fs::File::create(&log).unwrap();
    command
        .args(&tests)
        .current_dir(&package)
        .env("LEASH_SOCKET", &daemon.socket)
        .env("LEASH_BIN", daemon.leash_for_anyone())
        .env("LEASH_TEST_USER", USER_A.to_string())
        .env("LEASH_TEST_LIMITED_SOCKET", &limited.socket)
        .env("LEASH_TEST_MAX_TREES", MAX_TREES)
        .env("LEASH_TEST_NODE_MODULES", node_modules())
        .env("LEASH_TEST_CGROUP_PARENT", &groups.path)
        .env_remove("LEASH_LEASE")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        // A group of its own, to stop the runner and its per-file processes if time runs out.
        .process_group(0);
    let started = Instant::now();
    let mut runner = command.spawn().expect("starting node --test");
    let finished = wait_for(SUITE_DEADLINE, || runner.try_wait().unwrap().is_some());
    if !finished {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", runner.id())])
            .status();
    }
    let status = runner.wait().unwrap();
    let output = fs::read_to_string(&log).unwrap_or_default();
    println!(
        "node --test {} ({}, {:.1} s):\n{output}",
        tests.len(),
        node.version,
        started.elapsed().as_secs_f64()
    );
    assert!(
        finished,
        "the Node tests did not finish in {SUITE_DEADLINE:?}:\n{output}"
    );
    assert!(
        status.success(),
        "the Node tests failed ({status}):\n{output}"
    );
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
             installs it (apt-get install nodejs), or set {SKIP_VAR}=1 to leave them out"
        );
        let path = std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("node"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no `node` on PATH: {how}"));
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
        assert!(major >= 18, "{} is Node.js {version}: {how}", path.display());
        Self {
            path,
            version,
            major,
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_owned()
}

/// Where `cargo xtask test` installs the Claude Agent SDK (LEASH_HOSTS_CACHE, or
/// /var/cache/leash-hosts), for the test that runs it.
fn node_modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASH_TEST_NODE_MODULES") {
        return dir.into();
    }
    std::env::var_os("LEASH_HOSTS_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/leash-hosts"), PathBuf::from)
        .join("node_modules")
}

/// Copies the package (without any node_modules) where every user may read it.
fn copy_readable(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_dir() && entry.file_name() != "node_modules" {
            copy_readable(&source, &target);
        } else if kind.is_file() {
            fs::copy(&source, &target).unwrap();
            let executable = entry.metadata().unwrap().permissions().mode() & 0o111 != 0;
            let mode = if executable { 0o755 } else { 0o644 };
            fs::set_permissions(&target, fs::Permissions::from_mode(mode)).unwrap();
        }
    }
}

/// The suites, listed (node 18 and 20 take no glob, and differ on directories).
fn test_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".test.js"))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.test.js in {}", dir.display());
    files
}

/// A cgroup that holds the test runner, and under which the tests make their own groups
/// (LEASH_TEST_CGROUP_PARENT). Dropping it kills everything in it, however the tests ended,
/// and removes it with every group below it.
struct CgroupTree {
    path: PathBuf,
}

impl CgroupTree {
    fn new() -> Self {
        let path = cgroup2_root().join(format!("leash-node-tests-{}", std::process::id()));
        fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating the cgroup {}: {e}", path.display()));
        Self { path }
    }

    /// A command that joins the group, then execs `program`.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new("sh");
        command
            .args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.path.join("cgroup.procs"))
            .arg(program);
        command
    }

    fn populated(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| !events.contains("populated 0"))
            .unwrap_or(false)
    }
}

/// The groups below `dir`, deepest first.
fn groups_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            groups_below(&entry.path(), out);
            out.push(entry.path());
        }
    }
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        // cgroup.kill kills the whole subtree.
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        if !wait_for(Duration::from_secs(30), || !self.populated()) {
            eprintln!("processes are left in {}", self.path.display());
        }
        let mut groups = Vec::new();
        groups_below(&self.path, &mut groups);
        groups.push(self.path.clone());
        for group in groups {
            if let Err(e) = fs::remove_dir(&group) {
                eprintln!("could not remove {}: {e}", group.display());
            }
        }
    }
}
