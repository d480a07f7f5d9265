//! Which integration tests the guests run, and building them. Every test binary of tests/tests/
//! runs on every kernel unless it is left out below, with the reason: a new scenario is tested on
//! the old kernels without anyone having to remember it.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{cargo, workspace_root};

/// Test binaries the guests do not run, and why. A guest runs about five times slower than the
/// host under emulation (TCG), and CI runs four of them: what is left out here is either
/// impossible in a guest, a load test, or a test of user space alone, which behaves the same on
/// every kernel and runs on the host's (`cargo xtask test`).
#[rustfmt::skip]
pub(super) const LEFT_OUT: &[(&str, &str)] = &[
    ("systemd_unit", "runs systemd-analyze, which the guests do not have"),
    ("watch_tmux", "drives a terminal through tmux, which the guests do not have"),
    ("thousand", "a load test: a 1001-process tree; fork_chain and adopt_existing take the same kernel paths"),
    ("kill_steps", "a load test: 2001 members, the kill engine's step sizes (user space)"),
    ("flood", "a load test of the daemon's connection limits (user space)"),
    ("fd_exhaustion", "a load test of the daemon's descriptor handling (user space)"),
    ("kill_setsid_storm", "a load test: 20 trials of a 300-process setsid storm, over 10 minutes under emulation; doomed_fork and setsid_chain take its kernel paths"),
    ("setsid_storm_daemon", "the same storm as kill_setsid_storm, through the daemon"),
    ("untracked_storm", "a load test: 3000 fork+exec beside a tree, a minute under emulation; every scenario's check that its tree is exactly its cgroup sees untracked forks stay out"),
    ("slow_viewer", "a load test: 3000 fork+exec, 1.5 minutes under emulation, for the daemon's event queue (user space)"),
    ("garbage", "user space: the daemon's replies to malformed requests (fuzzed too)"),
    ("json_outputs", "user space: the JSON output formats"),
    ("secret_token", "user space: where a lease token may appear (argv, environment, descriptors)"),
    ("token_limits", "user space: per-uid accounting of registrations made with a token"),
    ("hijacked_dirs", "user space: the trust checks of the socket and pin directories"),
    ("run_refused", "user space: a refused `leash run` leaves nothing waiting"),
    ("grace_shortened", "user space: a pending grace only gets shorter"),
    ("metrics", "user space: the metrics endpoint; its checks run Python's prometheus_client and promtool, which the guests do not have"),
    ("host_python", "needs Python with pytest, which the guests do not have; the library's kernel paths are the exec shim's (exec_shim)"),
    ("host_node", "needs Node.js and the Claude Agent SDK, which the guests do not have; the library's kernel paths are the exec shim's (exec_shim)"),
    ("subordinate_uids", "user space: accounts per user; the kernel path, the whois iterator reading a user namespace's owner, is whois's"),
    ("tenancy", "user space: who sees which tree; the kernel path, the whois iterator reading pid namespaces, is whois's"),
    ("kill_nested", "user space: a kill's summary over nested trees"),
    ("log_volume", "user space: what the daemon logs at INFO"),
    ("fd_disposal", "a load test of the daemon's closing of descriptors clients send (user space)"),
    ("lease_sender", "user space: requests on a lease's connection from another process; SO_PASSCRED is older than every kernel leash supports"),
    ("doctor", "user space: leash doctor's report; its kernel probes are kernel/support.rs's, which every daemon start in the guests runs, and a tp_btf attach, which every daemon start makes"),
    ("version", "user space: --version, man pages and completions; its checks run man, groff and bash -n"),
    ("log_fields", "user space: the fields of the daemon's event lines"),
    ("deploy_manifests", "lints the image definition and the Kubernetes manifests with tools of the Python environment, which the guests do not have; no kernel path"),
];

/// A test binary to run in the guests.
pub(super) struct TestBinary {
    /// The name of its file in tests/tests/, without `.rs`.
    pub name: String,
    /// Where cargo built it: the guests run it at the same path.
    pub path: PathBuf,
}

/// Builds `leash` and every integration test binary; returns the binaries the guests run:
/// those `only` names, or all but [`LEFT_OUT`] when it is empty.
pub(super) fn build(only: &[String]) -> Result<Vec<TestBinary>> {
    // The tests run target/debug/leash, found next to their own directory.
    cargo(&["build", "--package", "leash-user"])?;
    let built = build_test_binaries(only)?;
    for name in only {
        if !built.iter().any(|binary| &binary.name == name) {
            bail!(
                "no test binary {name:?}; there are {}",
                built
                    .iter()
                    .map(|b| b.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let mut chosen: Vec<TestBinary> = built
        .into_iter()
        .filter(|binary| {
            if only.is_empty() {
                !LEFT_OUT.iter().any(|(name, _)| *name == binary.name)
            } else {
                only.contains(&binary.name)
            }
        })
        .collect();
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(chosen)
}

/// `cargo test -p leash-tests --no-run`, reading where each test binary went from cargo's JSON
/// messages (the file names carry a hash). Only the binaries `only` names when it is not empty
/// (each of them is checked to exist by cargo then), every one otherwise.
fn build_test_binaries(only: &[String]) -> Result<Vec<TestBinary>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut targets = Vec::new();
    if only.is_empty() {
        targets.push("--tests".to_owned());
    }
    for name in only {
        targets.extend(["--test".to_owned(), name.clone()]);
    }
    let mut child = Command::new(cargo)
        .args(["test", "--package", "leash-tests"])
        .args(&targets)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test --no-run")?;
    let stdout = child.stdout.take().context("cargo's output")?;
    let mut binaries = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's output")?;
        if let Some(binary) = test_binary(&line) {
            binaries.push(binary);
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("building the integration tests failed: {status}");
    }
    if binaries.is_empty() {
        bail!("cargo built no integration test binary");
    }
    Ok(binaries)
}

/// The test binary a line of cargo's JSON reports, if it reports one of tests/tests/.
fn test_binary(line: &str) -> Option<TestBinary> {
    let message: Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let target = &message["target"];
    if !target["kind"].as_array()?.iter().any(|kind| kind == "test") {
        return None;
    }
    Some(TestBinary {
        name: target["name"].as_str()?.to_owned(),
        path: PathBuf::from(message["executable"].as_str()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_test_left_out_exists() {
        let tests = workspace_root().join("tests/tests");
        for (name, reason) in LEFT_OUT {
            assert!(
                tests.join(format!("{name}.rs")).is_file(),
                "{name} is left out ({reason}) but tests/tests/{name}.rs does not exist"
            );
        }
    }

    #[test]
    fn cargo_messages_name_the_test_binaries() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"fork_chain"},"executable":"/w/target/debug/deps/fork_chain-0123"}"#;
        let binary = test_binary(line).unwrap();
        assert_eq!(binary.name, "fork_chain");
        assert_eq!(
            binary.path,
            PathBuf::from("/w/target/debug/deps/fork_chain-0123")
        );
        let library = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"leash_tests"},"executable":"/w/x"}"#;
        assert!(test_binary(library).is_none());
        let fresh = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"x"},"executable":null}"#;
        assert!(test_binary(fresh).is_none());
        assert!(test_binary("not json").is_none());
    }
}
