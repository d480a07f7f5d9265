//! `cargo xtask lint`: every static check of the project, each step named and run whatever the
//! others found, and the task failing at the end if any step failed:
//!
//! - rustfmt over the workspace;
//! - clippy over the host crates, built without the BPF toolchain (`AYA_BUILD_SKIP=1`, no
//!   bpf-linker on PATH), and over leash-ebpf for its BPF target (nightly,
//!   `-Z build-std=core`, as leash-user's build script builds it), warnings denied;
//! - ruff (lint and format) and `mypy --strict` over the Python library (clients/python, whose
//!   pyproject.toml configures them), installed pinned into the tests' virtual environment;
//! - `tsc` over the Node library (clients/node/tsconfig.json): its JavaScript, typed in JSDoc
//!   from its hand-written index.d.ts, must implement what index.d.ts declares (TypeScript and
//!   Node's types from npm, in a cache of their own);
//! - the import-cycle check (cycles.rs): no two files of a crate may name each other's items,
//!   directly or round a circle;
//! - that no integration test runs a file of the clone as another user, who may not be able to
//!   reach it (other_users.rs).

mod cycles;
mod other_users;

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cargo, cargo_command, ensure_nightly_rust_src, hosts, output, status, workspace_root};

/// The Python linters, pinned (mypy as the tests have it: see [`hosts::MYPY`]).
const PYTHON_LINTERS: &[&str] = &["ruff==0.17.5", hosts::MYPY];

/// One check: its name and what runs it.
struct Step {
    name: &'static str,
    run: fn() -> Result<()>,
}

const STEPS: &[Step] = &[
    Step {
        name: "rustfmt",
        run: rustfmt,
    },
    Step {
        name: "clippy (host crates, AYA_BUILD_SKIP, no bpf-linker)",
        run: clippy_host,
    },
    Step {
        name: "clippy (leash-ebpf, bpfel-unknown-none)",
        run: clippy_ebpf,
    },
    Step {
        name: "ruff (clients/python)",
        run: ruff,
    },
    Step {
        name: "mypy --strict (clients/python)",
        run: mypy,
    },
    Step {
        name: "tsc (clients/node)",
        run: tsc,
    },
    Step {
        name: "import cycles",
        run: import_cycles,
    },
    Step {
        name: "tests run no file of the clone as another user",
        run: other_users,
    },
];

pub(crate) fn lint() -> Result<()> {
    let mut failed = Vec::new();
    let mut results = Vec::new();
    for step in STEPS {
        eprintln!("\nxtask lint: == {} ==", step.name);
        let started = Instant::now();
        let result = (step.run)();
        let seconds = started.elapsed().as_secs_f64();
        match &result {
            Ok(()) => results.push(format!("PASS  {} ({seconds:.1} s)", step.name)),
            Err(e) => {
                eprintln!("xtask lint: {}: {e:#}", step.name);
                results.push(format!("FAIL  {} ({seconds:.1} s): {e:#}", step.name));
                failed.push(step.name);
            }
        }
    }
    eprintln!("\nxtask lint: summary");
    for line in &results {
        eprintln!("  {line}");
    }
    if !failed.is_empty() {
        bail!("lint failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Adds `component` to `toolchain` (None: the one cargo runs here) unless it is there; a
/// minimal rustup profile has neither rustfmt nor clippy.
fn ensure_component(toolchain: Option<&str>, component: &str) -> Result<()> {
    let mut list = Command::new("rustup");
    list.args(["component", "list", "--installed"]);
    list.args(toolchain.map(|t| format!("--toolchain={t}")));
    let installed = output(list.current_dir(workspace_root()))?;
    if installed.lines().any(|line| line.starts_with(component)) {
        return Ok(());
    }
    eprintln!(
        "xtask: adding {component} to the {} toolchain",
        toolchain.unwrap_or("default")
    );
    let mut add = Command::new("rustup");
    add.args(["component", "add", component]);
    add.args(toolchain.map(|t| format!("--toolchain={t}")));
    status(add.current_dir(workspace_root()))
}

fn rustfmt() -> Result<()> {
    ensure_component(None, "rustfmt")?;
    cargo(&["fmt", "--all", "--check"])
}

/// clippy over the host crates as a newcomer's editor or a machine without the BPF toolchain
/// builds them: `AYA_BUILD_SKIP=1` (leash-user's build script writes empty objects), with no
/// bpf-linker on PATH, in a target directory of its own (one that held the built objects would
/// pass without testing anything). So the workspace is shown to build and pass clippy without
/// nightly, rust-src or bpf-linker; leash-ebpf's own step checks the programs.
fn clippy_host() -> Result<()> {
    ensure_component(None, "clippy")?;
    let cargo = cargo_command();
    let toolchain = Path::new(cargo.get_program())
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(Path::to_path_buf);
    // The toolchain's own directory first (cargo, rustc, clippy-driver), then every PATH
    // entry that holds no bpf-linker (rustup's ~/.cargo/bin holds both it and the proxies).
    let path = env::var_os("PATH").unwrap_or_default();
    let without_linker = toolchain
        .into_iter()
        .chain(env::split_paths(&path).filter(|dir| !dir.join("bpf-linker").exists()));
    let path = env::join_paths(without_linker).context("joining PATH")?;
    let mut command = cargo;
    command
        .args(["clippy", "--workspace", "--all-targets"])
        .arg("--target-dir")
        .arg(workspace_root().join("target/lint-no-bpf"))
        .args(["--", "-D", "warnings"])
        .env("AYA_BUILD_SKIP", "1")
        .env("PATH", path);
    status(&mut command)
}

/// leash-ebpf as aya-build builds it (aya-build 0.2.0's `build_ebpf`): nightly, the BPF target,
/// core built from source, `bpf_target_arch` set. Checking needs no linker, so no bpf-linker.
/// Its own target directory: the host's is built by another toolchain.
fn clippy_ebpf() -> Result<()> {
    ensure_nightly_rust_src()?;
    ensure_component(Some("nightly"), "clippy")?;
    let arch = env::consts::ARCH;
    // rustup's proxy would run the toolchain that CARGO (stable) belongs to; ask for nightly.
    let mut command = Command::new("rustup");
    command
        .args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--package",
            "leash-ebpf",
        ])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(workspace_root().join("target/lint-ebpf"))
        .args(["--", "-D", "warnings"])
        .current_dir(workspace_root())
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\""),
        );
    status(&mut command)
}

/// The Python linters in the tests' virtual environment; returns its bin/ directory.
fn python_linters() -> Result<PathBuf> {
    let started = Instant::now();
    let python = hosts::ensure_python_packages(PYTHON_LINTERS)?;
    report_install("ruff and mypy", started);
    Ok(python.parent().context("the venv's bin")?.to_path_buf())
}

fn python_client() -> PathBuf {
    workspace_root().join("clients/python")
}

/// `ruff check`, and `ruff format --check` over the code (the README's examples are laid out
/// for reading, not by the formatter).
fn ruff() -> Result<()> {
    let bin = python_linters()?;
    let check = status(
        Command::new(bin.join("ruff"))
            .arg("check")
            .current_dir(python_client()),
    );
    let format = status(
        Command::new(bin.join("ruff"))
            .args(["format", "--check", "src", "tests", "examples"])
            .current_dir(python_client()),
    );
    check.and(format)
}

/// mypy with pyproject.toml's files (the package and its examples). The examples import the
/// package from src/, installed or not.
fn mypy() -> Result<()> {
    let bin = python_linters()?;
    status(
        Command::new(bin.join("mypy"))
            .arg("--strict")
            .env("MYPYPATH", "src")
            .current_dir(python_client()),
    )
}

/// Where TypeScript and Node's types are installed for this check: beside the host tests'
/// npm packages, without their 230 MB.
fn typescript_dir() -> PathBuf {
    hosts::cache_dir().join("lint")
}

fn tsc() -> Result<()> {
    hosts::ensure_node()?;
    let cache = typescript_dir();
    let started = Instant::now();
    hosts::install_npm_packages(
        &cache,
        &[hosts::TYPESCRIPT.to_owned(), hosts::NODE_TYPES.to_owned()],
    )?;
    report_install("typescript and @types/node", started);
    let modules = cache.join("node_modules");
    status(
        Command::new("node")
            .arg(modules.join("typescript/bin/tsc"))
            .args(["--project", "tsconfig.json", "--typeRoots"])
            .arg(modules.join("@types"))
            .current_dir(workspace_root().join("clients/node")),
    )
}

/// Says how long an install took, when it took long enough to have done one.
fn report_install(what: &str, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    if seconds > 1.0 {
        eprintln!("xtask lint: {what} ready in {seconds:.1} s");
    }
}

/// Every crate of the workspace, by its root files under src/.
fn crate_roots() -> Result<Vec<(String, Vec<PathBuf>)>> {
    let metadata = output(cargo_command().args(["metadata", "--no-deps", "--format-version=1"]))?;
    let metadata: serde_json::Value =
        serde_json::from_str(&metadata).context("reading cargo metadata")?;
    let mut crates = Vec::new();
    for package in metadata["packages"].as_array().context("packages")? {
        let name = package["name"].as_str().context("a package name")?;
        let manifest = Path::new(package["manifest_path"].as_str().context("a manifest")?);
        let src = manifest.parent().context("a package dir")?.join("src");
        let mut roots: Vec<PathBuf> = package["targets"]
            .as_array()
            .context("targets")?
            .iter()
            .filter_map(|t| t["src_path"].as_str().map(PathBuf::from))
            .filter(|path| path.starts_with(&src))
            .collect();
        roots.sort();
        roots.dedup();
        crates.push((name.to_owned(), roots));
    }
    crates.sort();
    Ok(crates)
}

fn import_cycles() -> Result<()> {
    let root = workspace_root();
    let relative = |path: &Path| {
        path.strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let mut found = 0;
    for (name, roots) in crate_roots()? {
        let cycles = cycles::crate_cycles(&roots)?;
        if cycles.is_empty() {
            eprintln!("{name}: no cycle");
        }
        for cycle in &cycles {
            found += 1;
            eprintln!(
                "{name}: a cycle of {} modules, each reaching every other through `use` and paths \
                 (a folder is named by the file that defines it, and stands for all below it):",
                cycle.files.len()
            );
            for file in &cycle.files {
                eprintln!("    {}", relative(file));
            }
            eprintln!("  the arrows among them (file → file it names items of: those items):");
            for (from, to, names) in &cycle.edges {
                eprintln!(
                    "    {} → {}: {}",
                    relative(from),
                    relative(to),
                    names.join(", ")
                );
            }
            let example: Vec<String> = cycle.example.iter().map(|f| relative(f)).collect();
            eprintln!("  for instance: {}", example.join(" → "));
        }
    }
    if found > 0 {
        bail!(
            "{found} import cycle(s): move what both sides need into a module of its own, or \
             pass it in, so that the arrows go one way"
        );
    }
    Ok(())
}

/// No test runs a file of the clone as another user (other_users.rs).
fn other_users() -> Result<()> {
    let root = workspace_root();
    let findings = other_users::check(&[root.join("tests/tests"), root.join("tests/src")])?;
    for finding in &findings {
        // A call is named as one: `leash_binary()`.
        let path = match finding.path.strip_suffix('(') {
            Some(function) => format!("{function}()"),
            None => finding.path.clone(),
        };
        eprintln!(
            "{}: fn {} runs something as another user and names the clone: {path}",
            finding
                .file
                .strip_prefix(&root)
                .unwrap_or(&finding.file)
                .display(),
            finding.function,
        );
    }
    if !findings.is_empty() {
        bail!(
            "{} test function(s) may run a file of the clone as another user, who cannot reach \
             a clone under a 0700 directory (/root): run a readable copy \
             (Daemon::leash_for_anyone, daemon::leash_for_anyone_in, copy_readable), or, if \
             only root runs the clone's file there, say so in a comment holding `{}`",
            findings.len(),
            other_users::ALLOWED
        );
    }
    eprintln!("no test runs a file of the clone as another user");
    Ok(())
}
