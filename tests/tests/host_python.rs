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
        .spawn()
        .unwrap();
    let mut stdin = host.stdin.take().unwrap();
    let mut lines = BufReader::new(host.stdout.take().unwrap()).lines();
    let mut next = move || -> serde_json::Value {
        let line = lines
            .next()
            .expect("the host ended early (its stderr is above)")
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
