//! `cargo xtask fuzz`: builds the fuzz targets in fuzz/ (nightly, cargo-fuzz, AddressSanitizer)
//! and runs each for a bounded time, from the checked-in seeds in fuzz/corpus/TARGET/ plus a
//! working corpus in fuzz/target/corpus/TARGET/ (kept between runs, never checked in). Fails if
//! a target crashes, naming the input that did it.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    time::SystemTime,
};

use anyhow::{Context, Result, bail};

use crate::{is_root, setup, status, workspace_root};

const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// What building cargo-fuzz from source takes, measured on 2 cores.
const CARGO_FUZZ_BUILD_MINUTES: u32 = 1;
/// Every target, in the order they run.
const TARGETS: [&str; 2] = ["request", "connection"];
/// libFuzzer stops a target that grows past this (the connection target, with the daemon
/// and AddressSanitizer, holds about 400 MB).
const RSS_LIMIT_MB: u32 = 2048;
/// One input running longer than this is a hang (the connection target's own deadlines are
/// shorter).
const INPUT_TIMEOUT_S: u32 = 60;

pub(crate) fn fuzz(seconds: u64, target: Option<&str>) -> Result<()> {
    let targets: Vec<&str> = match target {
        Some(name) if TARGETS.contains(&name) => vec![name],
        Some(name) => bail!("no fuzz target {name:?}; there are {}", TARGETS.join(", ")),
        None => TARGETS.to_vec(),
    };
    if seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    // The connection target runs the daemon core: the eBPF build, root.
    setup()?;
    if !is_root() {
        eprintln!("xtask: warning: not root; the connection target needs root to load BPF");
    }
    crate::ensure_cargo_subcommand(
        Some("nightly"),
        "fuzz",
        CARGO_FUZZ_VERSION,
        CARGO_FUZZ_BUILD_MINUTES,
    )?;
    let root = workspace_root();
    for target in targets {
        run_target(&root, target, seconds)?;
    }
    Ok(())
}

fn run_target(root: &Path, target: &str, seconds: u64) -> Result<()> {
    eprintln!("xtask: building the fuzz target {target}");
    status(
        Command::new("cargo")
            .args(["+nightly", "fuzz", "build", "--debug-assertions", target])
            .current_dir(root),
    )?;
    // cargo-fuzz builds for the host; running the binary here, not through `cargo fuzz run`,
    // keeps a crash's report to libFuzzer's (cargo-fuzz would also print the input as a list
    // of numbers, 300 kB for a long line).
    let binary = root
        .join("fuzz/target")
        .join(format!("{}-unknown-linux-gnu", env::consts::ARCH))
        .join("release")
        .join(target);
    let seeds = root.join("fuzz/corpus").join(target);
    // New inputs go to the first corpus directory: this one, not the checked-in seeds.
    let working = root.join("fuzz/target/corpus").join(target);
    let artifacts = root.join("fuzz/artifacts").join(target);
    for dir in [&working, &artifacts] {
        fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    }
    let started = SystemTime::now();
    let mut command = Command::new(&binary);
    command
        .arg(&working)
        .arg(&seeds)
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg(format!("-max_len={}", max_len(target)))
        .arg("-print_final_stats=1")
        .arg(format!(
            "-dict={}",
            root.join("fuzz/protocol.dict").display()
        ))
        // As cargo-fuzz sets it: Rust code trips the ODR check without a real violation.
        .env("ASAN_OPTIONS", asan_options())
        .current_dir(root);
    if target == "connection" {
        // The daemon's threads allocate while an input runs, so libFuzzer would look for
        // leaks after nearly every input, at a tenth of the speed.
        command.arg("-detect_leaks=0");
    }
    eprintln!("xtask: fuzzing {target} for {seconds} s");
    let result = status(&mut command);
    let found = written_since(&artifacts, started);
    if result.is_ok() && found.is_empty() {
        return Ok(());
    }
    for input in &found {
        let input = input.strip_prefix(root).unwrap_or(input).display();
        eprintln!(
            "xtask: {target} failed on {input}\n  reproduce: cargo +nightly fuzz run {target} \
             {input} -- -detect_leaks=0\n  once fixed, keep it as a seed: cp {input} \
             fuzz/corpus/{target}/regression-WHAT-IT-IS"
        );
    }
    if found.is_empty() {
        bail!("fuzzing {target} failed, and wrote no crashing input: see its output above");
    }
    bail!("fuzzing {target} found a crash")
}

fn asan_options() -> String {
    let mut options = env::var("ASAN_OPTIONS").unwrap_or_default();
    if !options.is_empty() {
        options.push(':');
    }
    options.push_str("detect_odr_violation=0");
    options
}

/// The longest input a target is given: a request line up to the daemon's limit; two lines
/// past it for a connection.
fn max_len(target: &str) -> usize {
    const MAX_LINE_BYTES: usize = 64 * 1024;
    if target == "connection" {
        2 * MAX_LINE_BYTES
    } else {
        MAX_LINE_BYTES
    }
}

/// The files in `dir` written since `time` (libFuzzer names a crash's input by its hash, so the
/// same crash again rewrites the same file).
fn written_since(dir: &Path, time: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .metadata()
                .and_then(|meta| meta.modified())
                .is_ok_and(|modified| modified >= time)
        })
        .map(|entry| entry.path())
        .collect()
}
