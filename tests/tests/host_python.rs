//! The Python host library (clients/python) against the real daemon: its pytest suite, run by
//! the Python environment `cargo xtask test` makes in target/hosts/python (pytest, and the
//! package installed from clients/python). The tests import the package from the source tree,
//! so they test what is checked out; the installed copy proves it installs.
//!
//! The daemon allows few trees per uid, for the test that reaches the limit; the tests run a
//! host as USER_A (an unprivileged user, like a desktop application) where it matters.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use leash_tests::daemon::{Daemon, USER_A};

/// Trees per non-root uid: small, so that a host reaches the limit at once.
const MAX_TREES: &str = "3";

#[test]
fn python_host_library() {
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", MAX_TREES]) else {
        return;
    };
    let workspace = workspace();
    let python = workspace.join("target/hosts/python/bin/python");
    assert!(
        python.is_file(),
        "no Python environment at {}: run `cargo xtask test`, which creates it",
        python.display()
    );
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
        .arg(format!("--basetemp={}", daemon.dir.join("pytest").display()))
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

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_owned()
}
