//! The Python host library (clients/python) against the real daemon: its pytest suite, run by
//! the Python environment `cargo xtask test` makes in target/hosts/python (pytest, and the
//! package installed from clients/python). The tests import the package from the source tree,
//! so they test what is checked out; the installed copy proves it installs.
//!
//! The daemon allows few trees per uid, for the test that reaches the limit; the tests run a
//! host as USER_A (an unprivileged user, like a desktop application) where it matters.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

use leash_tests::{
    Cgroup, SKIP_HOSTS_VAR,
    daemon::{Daemon, USER_A},
    hosts_skipped, workspace_root,
};

/// Trees per non-root uid: small, so that a host reaches the limit at once.
const MAX_TREES: &str = "3";

#[test]
fn python_host_library() {
    if hosts_skipped("Python host library's") {
        return;
    }
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", MAX_TREES]) else {
        return;
    };
    let workspace = workspace_root();
    let python = venv_python();
    let output = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "clients/python/tests",
            "-q",
            "-rfE",
            "-p",
            "no:cacheprovider",
        ])
        // pytest's temporary directories go with the daemon's, which is removed on drop.
        .arg(format!(
            "--basetemp={}",
            daemon.dir.join("pytest").display()
        ))
        .current_dir(&workspace)
        .env("LEASH_SOCKET", &daemon.socket)
        .env("LEASH_BIN", daemon.leash_for_anyone())
        .env("LEASH_TEST_USER", USER_A.to_string())
        .env("LEASH_TEST_MAX_TREES", MAX_TREES)
        .env("PYTHONPATH", workspace.join("clients/python/src"))
        // Nothing written into the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("LEASH_LEASE")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("pytest:\n{stdout}{stderr}");
    assert!(
        output.status.success(),
        "the Python host library's tests failed ({}); pytest's output is above",
        output.status
    );
    assert!(
        stdout.contains(" passed"),
        "pytest ran no test; its output is above"
    );
}

/// A Python host through a hand-over: its connection is lost; the next calls connect again
/// (a new lease, a new token for the shim), and the tree it started before is still its own,
/// listed by `trees()` and killed by `close()` with the one started after.
const HOST_THROUGH_A_HAND_OVER: &str = r#"
import json, sys, leash
lease = leash.Lease()
before = lease.popen(sys.argv[1:])
print(json.dumps({"tree": before.leash_tree}), flush=True)
sys.stdin.readline()  # the daemon hands over, and the next one starts
after = lease.popen(sys.argv[1:])
trees = sorted(t.tree for t in lease.trees())
print(json.dumps({"trees": trees, "after": after.leash_tree}), flush=True)
lease.close()
print(json.dumps({"exits": [before.wait(), after.wait()]}), flush=True)
"#;

#[test]
fn a_python_host_keeps_its_trees_through_a_daemon_hand_over() {
    use std::io::{BufRead, BufReader, Write};
    if hosts_skipped("Python host library's") {
        return;
    }
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("python-hand-over");
    let mut host = Command::new(venv_python())
        .args(["-c", HOST_THROUGH_A_HAND_OVER])
        .args(cgroup.argv("sleep", &["600"]))
        .env("LEASH_SOCKET", &daemon.socket)
        .env("LEASH_BIN", leash_tests::leash_binary())
        .env("PYTHONPATH", workspace_root().join("clients/python/src"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its warning of the hand-over, and anything it says as it fails.
        .stderr(daemon.clients_log())
        .spawn()
        .unwrap();
    let mut stdin = host.stdin.take().unwrap();
    let mut lines = BufReader::new(host.stdout.take().unwrap()).lines();
    let mut next = move || -> serde_json::Value {
        let line = lines
            .next()
            .expect("the host ended early (its stderr is below, with the daemon's log)")
            .unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let before = next()["tree"].as_u64().expect("a tree");
    cgroup.settle_exactly(&["sleep"]);

    assert!(daemon.hand_over(), "the daemon exits cleanly on SIGHUP");
    daemon.restart();
    writeln!(stdin, "go").unwrap();
    let listed = next();
    let after = listed["after"].as_u64().expect("a tree");
    assert_eq!(
        listed["trees"],
        serde_json::json!([before, after]),
        "{listed}"
    );
    let exits = next();
    // close() has returned: both trees are empty.
    assert!(cgroup.procs().is_empty(), "left: {:?}", cgroup.procs());
    assert_eq!(exits["exits"], serde_json::json!([-15, -15]), "{exits}");
    assert!(host.wait().unwrap().success());
}

fn venv_python() -> PathBuf {
    let python = workspace_root().join("target/hosts/python/bin/python");
    assert!(
        python.is_file(),
        "no Python environment at {}: run `cargo xtask test`, which creates it (or set \
         {SKIP_HOSTS_VAR}=1 to leave the host libraries' tests out)",
        python.display()
    );
    python
}

/// The interpreter another user can run (the tests' environment's is under /root).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// Copies the files of the installed distribution `hatchling` and of everything it requires
/// (its build backend, as target/hosts/python has it pinned) into `sys.argv[1]`: a directory
/// another user's pip imports the backend from, with no index to download it from.
const COPY_BUILD_BACKEND: &str = r#"
import importlib.metadata as metadata, os, re, shutil, sys
from packaging.requirements import Requirement
dest, todo, seen = sys.argv[1], ["hatchling"], set()
while todo:
    name = todo.pop()
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        continue
    seen.add(key)
    dist = metadata.distribution(name)
    for file in dist.files or []:
        if str(file).startswith(".."):  # its scripts, in bin/
            continue
        target = os.path.join(dest, str(file))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(dist.locate_file(file), target)
    for requirement in map(Requirement, dist.requires or []):
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            todo.append(requirement.name)
"#;

/// A directory of the test's own, removed however the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `pip install /path/to/clients/python` by an unprivileged user from a checkout it cannot
/// write (a system-wide clone, a read-only mount): the build writes nothing into the source
/// tree (setuptools wrote an egg-info there, and failed). No index is reached: the build
/// backend is the one pinned in target/hosts/python, on the build's PYTHONPATH.
#[test]
fn the_package_installs_as_another_user_from_a_read_only_checkout() {
    use std::{fs, os::unix::fs::PermissionsExt};
    if hosts_skipped("Python host library's") {
        return;
    }
    assert!(
        std::path::Path::new(SYSTEM_PYTHON).is_file(),
        "no {SYSTEM_PYTHON}: the test installs with the system's Python as another user \
         (Debian/Ubuntu: apt-get install python3 python3-venv)"
    );
    let scratch = Scratch(PathBuf::from(format!(
        "/tmp/leash-pyinstall-{}",
        std::process::id()
    )));
    let _ = fs::remove_dir_all(&scratch.0);
    fs::create_dir(&scratch.0).unwrap();
    fs::set_permissions(&scratch.0, fs::Permissions::from_mode(0o755)).unwrap();

    // The checkout, read-only for everyone but root. Readable by other users: root copies
    // clients/python and the build backend out of the clone, and the user runs the copies.
    let checkout = scratch.0.join("checkout");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("clients/python"))
        .arg(&checkout)
        .status()
        .unwrap();
    assert!(copied.success(), "copying clients/python");
    let read_only = Command::new("chmod")
        .args(["-R", "a-w,a+rX"])
        .arg(&checkout)
        .status()
        .unwrap();
    assert!(read_only.success(), "making the copy read-only");
    let before = listing(&checkout);

    let backend = scratch.0.join("backend");
    let status = Command::new(venv_python())
        .args(["-c", COPY_BUILD_BACKEND])
        .arg(&backend)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "copying the build backend from {}",
        venv_python().display()
    );
    let readable = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&backend)
        .status()
        .unwrap();
    assert!(readable.success());

    let home = scratch.0.join("home");
    fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(USER_A), Some(USER_A)).unwrap();
    let venv = home.join("venv");
    let as_user = |program: &std::path::Path, args: &[&str]| -> String {
        let output = Command::new("setpriv")
            .args(leash_tests::daemon::setpriv_args(USER_A))
            .arg(program)
            .args(args)
            .current_dir(&home)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("PYTHONPATH", &backend)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PIP_NO_INDEX", "1")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "{} {args:?} as uid {USER_A} failed ({}):\n{said}",
            program.display(),
            output.status
        );
        said
    };
    as_user(
        SYSTEM_PYTHON.as_ref(),
        &["-m", "venv", leash_tests::daemon::path_str(&venv)],
    );
    let python = venv.join("bin/python");
    as_user(
        &python,
        &[
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            "--no-cache-dir",
            "--disable-pip-version-check",
            leash_tests::daemon::path_str(&checkout),
        ],
    );
    assert_eq!(
        listing(&checkout),
        before,
        "the install wrote into the checkout"
    );

    // Imported from the venv (not from the checkout: the backend's path is left out too).
    let imported = Command::new("setpriv")
        .args(leash_tests::daemon::setpriv_args(USER_A))
        .arg(&python)
        .args([
            "-c",
            "import importlib.metadata as m, leash; \
             print(leash.__version__, m.version('leash-client'), leash.__file__)",
        ])
        .current_dir(&home)
        .env_clear()
        .env("HOME", &home)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&imported.stdout);
    assert!(
        imported.status.success(),
        "importing leash: {said}{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let version = package_version();
    let words: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(words[..2], [version.as_str(), version.as_str()], "{said}");
    assert!(
        words[2].starts_with(leash_tests::daemon::path_str(&venv)),
        "leash was imported from {} instead of the venv",
        words[2]
    );
}

/// Every path under `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(next) = todo.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path.clone());
            }
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The version clients/python/pyproject.toml gives the package.
fn package_version() -> String {
    let pyproject =
        std::fs::read_to_string(workspace_root().join("clients/python/pyproject.toml")).unwrap();
    pyproject
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a version in pyproject.toml")
        .to_owned()
}
