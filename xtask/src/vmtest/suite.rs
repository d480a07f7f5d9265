//! Which integration tests the guests run, and building them. The integration tests are one test
//! binary, [`TEST_BINARY`], with a module per scenario (a file of tests/tests/); every scenario
//! runs on every kernel unless it is left out below, with the reason: a new scenario is tested on
//! the old kernels without anyone having to remember it.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::arch::Arch;
use crate::{cargo, cargo_command, cross, workspace_root};

/// The integration tests' test binary (tests/Cargo.toml; its root is tests/tests/main.rs).
pub(super) const TEST_BINARY: &str = "scenarios";

/// Scenarios (modules of the test binary, files of tests/tests/) the guests do not run, and
/// why. A guest runs about five times slower than the host under emulation (TCG), and CI runs
/// four of them: what is left out here is either impossible in a guest, a load test, or a test
/// of user space alone, which behaves the same on every kernel and runs on the host's (`cargo
/// xtask test`).
#[rustfmt::skip]
pub(super) const LEFT_OUT: &[(&str, &str)] = &[
    ("systemd_unit", "runs systemd-analyze, which the guests do not have"),
    ("doc_examples", "type-checks the docs' code blocks with mypy and tsc, which the guests do not have"),
    ("watch_tmux", "drives a terminal through tmux, which the guests do not have"),
    ("tiocsti", "drives a shell in a terminal through tmux, which the guests do not have"),
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
    ("cli_words", "user space: what leash run, exec, kill and watch say, and their exit statuses"),
    ("secret_token", "user space: where a lease token may appear (argv, environment, descriptors)"),
    ("token_limits", "user space: per-uid accounting of registrations made with a token"),
    ("hijacked_dirs", "user space: the trust checks of the socket and pin directories"),
    ("parked_flood", "a load test of the daemon's disposal (user space): connections parked behind a stuck close"),
    ("userns_flood", "a load test of the daemon's admission at accept (user space): a connect-and-close flood from a user namespace"),
    ("quiet_output", "user space: what the commands print (a closed pipe, CMD without `--`, one guard line at start)"),
    ("pin_lock", "user space: the pin directory's lock (flock), one daemon per pin directory; daemon_restart takes the pins over in the guests"),
    ("run_refused", "user space: a refused `leash run` leaves nothing waiting"),
    ("grace_shortened", "user space: a pending grace only gets shorter"),
    ("metrics", "user space: the metrics endpoint; its checks run Python's prometheus_client and promtool, which the guests do not have"),
    ("host_memory", "host_death's kernel path with a host holding 1 GiB, whose touching takes a minute under emulation; host_death runs the same path with small hosts"),
    ("host_words", "user space: the host libraries' lists of the protocol's words"),
    ("host_python", "needs Python with pytest, which the guests do not have; the library's kernel paths are the exec shim's (exec_shim)"),
    ("host_node", "needs Node.js and the Claude Agent SDK, which the guests do not have; the library's kernel paths are the exec shim's (exec_shim)"),
    ("host_packages", "installs wheels and npm tarballs with Python, pip and npm, which the guests do not have; checks packaging and the binary's lookup (user space)"),
    ("acp_examples", "needs Node.js, which the guests do not have: the ACP examples' hosts and agent; their kernel paths are the exec shim's (exec_shim) and a killed host's (host_death)"),
    ("subordinate_uids", "user space: accounts per user; the kernel path, the whois iterator reading a user namespace's owner, is whois's"),
    ("tenancy", "user space: who sees which tree; the kernel path, the whois iterator reading pid namespaces, is whois's"),
    ("kill_nested", "user space: a kill's summary over nested trees"),
    ("log_volume", "user space: what the daemon logs at INFO"),
    ("fd_disposal", "a load test of the daemon's closing of descriptors clients send (user space)"),
    ("lease_sender", "user space: requests on a lease's connection from another process; SO_PASSCRED is older than every kernel leash supports"),
    ("doctor", "user space: leash doctor's report; its kernel probes are kernel/support.rs's, which every daemon start in the guests runs, and a tp_btf attach, which every daemon start makes"),
    ("version", "user space: --version, man pages and completions; its checks run man, groff and bash -n"),
    ("log_fields", "user space: the fields of the daemon's event lines"),
    ("daemon_start_errors", "user space: the daemon's refusals to start (not root, a shared or relative socket path), before it loads anything"),
    ("deploy_manifests", "lints the image definition and the Kubernetes manifests with tools of the Python environment, which the guests do not have; no kernel path"),
];

/// The scenarios an arm64 guest runs by default (`--all` runs every one of the x86 guests'):
/// arm64 guests are emulated instruction by instruction, and CI has 8 minutes for them, cross
/// build included (this subset on trixie-6.12: 4 to 5 minutes on 2 cores, the build from clean
/// 2.4 to 3.4 of them, the guest 100 s). The seed scenarios of tracking and enforcement, threads, a kill, the daemon's
/// restart and take-over, unprivileged users, and the ptrace guard and the marks, whose LSM and
/// fmod_ret programs need BPF trampolines, which arm64 implements apart from x86's and attaches
/// to kernel functions only since 6.4 (bookworm-6.1 takes the syscall-tracepoint fallback, and
/// layered membership).
pub(super) const ARM64_SUBSET: &[&str] = &[
    "agent_dies",
    "host_dies",
    "double_fork",
    "setsid_chain",
    "fork_chain",
    "root_exit",
    "threads",
    "kill_threads",
    "kill_grace",
    "daemon_restart",
    "unprivileged",
    "ptrace_guard",
    "membership",
];

/// What the guests run.
pub(super) struct Suite {
    /// Where cargo built the test binary: the guests run it at the same path.
    pub binary: PathBuf,
    /// The scenarios the guests run, by name.
    pub scenarios: Vec<Scenario>,
    /// The arguments after `--` that do not choose tests (`--test-threads 1`, `--nocapture`):
    /// every run of the binary in the guests gets them.
    pub run_args: Vec<String>,
}

/// One scenario as the guests run it: the test binary, given exactly its tests' names.
pub(super) struct Scenario {
    /// Its module: the name of its file in tests/tests/, without `.rs`.
    pub name: String,
    /// The full names of the tests to run (`fork_chain::a_fork_chain_is_tracked_hop_by_hop`).
    pub tests: Vec<String>,
}

/// Builds `leash` and the test binary; returns what the guests run: the scenarios `only` names,
/// or all but [`LEFT_OUT`] when it is empty, each with its tests that `test_args` choose.
///
/// The tests are chosen here, from the binary's own list, and the guests get their exact names:
/// libtest's filters are substrings of `module::test`, so a filter cannot name a module (`threads::`
/// matches `kill_threads::` too), and one process per scenario keeps each scenario's result, and
/// its timeout, its own, as when each was a binary of its own.
pub(super) fn build(only: &[String], test_args: &[String], arch: Arch, all: bool) -> Result<Suite> {
    let binary = if arch.builds_std() {
        cross_build(arch)?
    } else {
        // The tests run target/debug/leash, found next to their own directory.
        cargo(&["build", "--package", "leash-user"])?;
        let mut command = cargo_command();
        command.args(["test", "--no-run"]);
        build_test_binary(command)?
    };
    let lister = Lister {
        binary: &binary,
        arch,
    };
    let every = by_scenario(lister.list(&[])?);
    for name in only {
        if !every.contains_key(name) {
            bail!(
                "no scenario {name:?}; there are {}",
                every.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    let (selection, run_args) = split_test_args(test_args);
    let scenarios: Vec<Scenario> = by_scenario(lister.list(&selection)?)
        .into_iter()
        .filter(|(name, _)| {
            if !only.is_empty() {
                only.contains(name)
            } else if arch == Arch::Aarch64 && !all {
                ARM64_SUBSET.contains(&name.as_str())
            } else {
                !LEFT_OUT.iter().any(|(left_out, _)| left_out == name)
            }
        })
        .map(|(name, tests)| Scenario { name, tests })
        .collect();
    if scenarios.is_empty() {
        bail!("no test to run: the arguments after -- ({test_args:?}) choose none");
    }
    Ok(Suite {
        binary,
        scenarios,
        run_args,
    })
}

/// Where the cross builds go: a target directory of their own, so that their nightly build
/// and the host's stable one never rebuild each other's dependencies.
const CROSS_TARGET_DIR: &str = "target/cross";

/// The standard library's crates, optimized in the cross build's dev profile. `-Z build-std`
/// builds them in the profile of the build (x86_64's std comes prebuilt, optimized), and
/// unoptimized they doubled a daemon's start in an arm64 guest (8 s rather than 4 on
/// trixie-6.12): the kernel BTF's parsing runs through core's UTF-8 checks, slices and
/// hashing. Their generic code is compiled in the crates that use it, at those crates' level.
const OPTIMIZED_STD: [&str; 6] = [
    "--config",
    "profile.dev.package.std.opt-level=3",
    "--config",
    "profile.dev.package.core.opt-level=3",
    "--config",
    "profile.dev.package.alloc.opt-level=3",
];

/// `leash` and the test binary for `arch` (aarch64), cross-built: nightly cargo builds the
/// standard library for it ([`cross::BUILD_STD`]; only x86_64's comes with the toolchain here)
/// and Debian's cross gcc links. Without debug information: the images are built from them as
/// they are (this machine's objcopy cannot strip other architectures), and the build takes
/// less time.
fn cross_build(arch: Arch) -> Result<PathBuf> {
    // One build of both, `leash` and the test binary: two would each build leash-user and
    // what both use, with the features each alone unifies (a minute more from clean).
    let mut command = cross_cargo_build(arch)?;
    command
        .args(["--package", "leash-user", "--bin", "leash"])
        .env("CARGO_PROFILE_DEV_DEBUG", "0");
    eprintln!(
        "xtask: cross-building leash and the tests for {}",
        arch.rust_target()
    );
    build_test_binary(command)
}

/// `cargo build` for `arch` as the cross builds run it, in their own target directory
/// ([`CROSS_TARGET_DIR`]): nightly, the standard library built for the target
/// ([`cross::BUILD_STD`], optimized in the dev profile too), linked by Debian's cross gcc
/// (installed when missing). The caller adds what to build, and the profile.
pub(crate) fn cross_cargo_build(arch: Arch) -> Result<Command> {
    arch.ensure_gcc_toolchain()?;
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo", "build"])
        .args(cross::BUILD_STD)
        .args(OPTIMIZED_STD)
        .args(["--target", arch.rust_target()])
        .arg("--target-dir")
        .arg(cross_target_dir())
        .env(arch.cargo_linker_var(), arch.gcc())
        .current_dir(workspace_root());
    Ok(command)
}

/// Where [`cross_cargo_build`] builds: PROFILE/ of this directory's target's directory.
pub(crate) fn cross_target_dir() -> PathBuf {
    workspace_root().join(CROSS_TARGET_DIR)
}

/// Builds the test binary (`--package leash-tests --test scenarios`) with `cargo`, a cargo
/// command that builds tests (`cargo test --no-run`, `cargo build`) for its target, reading
/// where the binary went from cargo's JSON messages (its file name carries a hash).
fn build_test_binary(mut cargo: Command) -> Result<PathBuf> {
    let mut child = cargo
        .args(["--package", "leash-tests", "--test", TEST_BINARY])
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo to build the tests")?;
    let stdout = child.stdout.take().context("cargo's output")?;
    let mut built = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's output")?;
        if let Some(binary) = test_binary(&line).filter(|binary| binary.name == TEST_BINARY) {
            built = Some(binary.path);
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("building the integration tests failed: {status}");
    }
    built.with_context(|| format!("cargo built no test binary {TEST_BINARY}"))
}

/// A test binary a line of cargo's JSON reports.
struct TestBinary {
    name: String,
    path: PathBuf,
}

/// The test binary a line of cargo's JSON reports, if it reports one.
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

/// Lists the tests of a test binary of `arch`.
struct Lister<'a> {
    binary: &'a Path,
    arch: Arch,
}

impl Lister<'_> {
    /// The full names of the tests the binary runs given `selection` (filters, `--skip`,
    /// `--exact`), from its `--list --format terse`: one `NAME: test` line each. A binary of
    /// another architecture lists under QEMU's user-mode emulation ([`Arch::run`]).
    fn list(&self, selection: &[String]) -> Result<Vec<String>> {
        let mut command = self.arch.run(self.binary);
        list_tests(&mut command, self.binary, selection)
    }
}

/// The full names of the tests `command` (running `binary`) lists given `selection`.
fn list_tests(command: &mut Command, binary: &Path, selection: &[String]) -> Result<Vec<String>> {
    let output = command
        .args(["--list", "--format", "terse"])
        .args(selection)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {} --list", binary.display()))?;
    if !output.status.success() {
        bail!(
            "{} --list {selection:?} failed: {}",
            binary.display(),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Full test names by their scenario, the module before the first `::`.
fn by_scenario(tests: Vec<String>) -> BTreeMap<String, Vec<String>> {
    let mut scenarios: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for test in tests {
        let scenario = test
            .split_once("::")
            .map_or(test.as_str(), |(module, _)| module);
        scenarios.entry(scenario.to_owned()).or_default().push(test);
    }
    scenarios
}

/// The arguments after `--` (libtest's), split into those that choose tests, which the list
/// here applies (name filters, `--skip NAME`, `--exact`), and those every run in the guests
/// gets (`--test-threads 1`, `--nocapture`...). `--ignored` and `--include-ignored` go to both:
/// they choose, and an ignored test named exactly still runs only with them.
fn split_test_args(args: &[String]) -> (Vec<String>, Vec<String>) {
    // libtest's options whose value is the next argument, other than --skip.
    const WITH_VALUE: [&str; 6] = [
        "--test-threads",
        "--logfile",
        "--color",
        "--format",
        "-Z",
        "--shuffle-seed",
    ];
    let (mut selection, mut run) = (Vec::new(), Vec::new());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--skip" => {
                selection.push(arg.clone());
                selection.extend(args.next().cloned());
            }
            "--ignored" | "--include-ignored" => {
                selection.push(arg.clone());
                run.push(arg.clone());
            }
            "--exact" => selection.push(arg.clone()),
            skip if skip.starts_with("--skip=") => selection.push(arg.clone()),
            option if WITH_VALUE.contains(&option) => {
                run.push(arg.clone());
                run.extend(args.next().cloned());
            }
            option if option.starts_with('-') => run.push(arg.clone()),
            _ => selection.push(arg.clone()),
        }
    }
    (selection, run)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn every_scenario_of_the_arm64_subset_exists_and_is_not_left_out() {
        let tests = workspace_root().join("tests/tests");
        for name in ARM64_SUBSET {
            assert!(tests.join(format!("{name}.rs")).is_file(), "{name}");
            assert!(
                !LEFT_OUT.iter().any(|(left_out, _)| left_out == name),
                "{name}"
            );
        }
    }

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

    /// cargo builds only what tests/tests/main.rs declares (autotests = false): a file it does
    /// not would never run.
    #[test]
    fn every_scenario_file_is_a_module_of_the_test_binary() {
        let dir = workspace_root().join("tests/tests");
        let main = fs::read_to_string(dir.join("main.rs")).unwrap();
        let declared: Vec<&str> = main
            .lines()
            .filter_map(|line| line.strip_prefix("mod ")?.strip_suffix(';'))
            .collect();
        let mut files: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|name| Some(name.strip_suffix(".rs")?.to_owned()))
            .filter(|name| name != "main")
            .collect();
        files.sort();
        for name in &files {
            assert!(
                declared.contains(&name.as_str()),
                "tests/tests/{name}.rs is not declared in tests/tests/main.rs (`mod {name};`)"
            );
        }
        assert_eq!(declared.len(), files.len(), "a module without its file");
    }

    #[test]
    fn cargo_messages_name_the_test_binary() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"scenarios"},"executable":"/w/target/debug/deps/scenarios-0123"}"#;
        let binary = test_binary(line).unwrap();
        assert_eq!(binary.name, "scenarios");
        assert_eq!(
            binary.path,
            PathBuf::from("/w/target/debug/deps/scenarios-0123")
        );
        let library = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"leash_tests"},"executable":"/w/x"}"#;
        assert!(test_binary(library).is_none());
        let fresh = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"x"},"executable":null}"#;
        assert!(test_binary(fresh).is_none());
        assert!(test_binary("not json").is_none());
    }

    #[test]
    fn tests_are_grouped_by_their_module_which_no_other_name_contains() {
        let scenarios = by_scenario(
            [
                "threads::a",
                "kill_threads::b",
                "threads::c",
                "thread_exits::d",
            ]
            .map(String::from)
            .to_vec(),
        );
        assert_eq!(scenarios["threads"], ["threads::a", "threads::c"]);
        assert_eq!(scenarios["kill_threads"], ["kill_threads::b"]);
        assert_eq!(scenarios.len(), 3);
    }

    #[test]
    fn arguments_that_choose_tests_are_kept_from_the_guests() {
        let args = [
            "fifty",
            "--skip",
            "threads::",
            "--exact",
            "--test-threads",
            "1",
            "--nocapture",
            "--skip=x",
            "--ignored",
            "--format",
            "pretty",
        ]
        .map(String::from);
        let (selection, run) = split_test_args(&args);
        assert_eq!(
            selection,
            [
                "fifty",
                "--skip",
                "threads::",
                "--exact",
                "--skip=x",
                "--ignored"
            ]
        );
        assert_eq!(
            run,
            [
                "--test-threads",
                "1",
                "--nocapture",
                "--ignored",
                "--format",
                "pretty"
            ]
        );
    }
}
