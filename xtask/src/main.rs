//! Project tasks: `cargo xtask setup | test | lint | vmtest | run | bench | install | fuzz | dist |
//! deb | packages | userlands | systemtest | image`. Each installs what it needs first, so a fresh
//! clone on a fresh Debian/Ubuntu machine needs nothing else.

use std::{
    env,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench_section;
mod cross;
mod dist;
mod fuzz;
mod hosts;
mod image;
mod lint;
mod packages;
mod systemtest;
mod userland;
mod vmtest;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// bpf-linker must be built against the LLVM major version of the nightly rustc.
const LLVM_MAJOR: &str = "22";

#[derive(Parser)]
#[command(about = "leash project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building the eBPF programs needs: nightly rust-src, LLVM dev packages and
    /// bpf-linker. Quick when everything is present.
    Setup,
    /// Set up, build, and run every test (as root: the integration tests load the programs
    /// into the running kernel), the host libraries' among them: installs pytest and the
    /// deployment files' linters (kubernetes-validate, hadolint) into target/hosts/python,
    /// Node.js if missing, and the Claude Agent SDK from npm into
    /// /var/cache/leash-hosts (LEASH_HOSTS_CACHE=DIR to change it; LEASH_TEST_SKIP_HOSTS=1
    /// leaves those tests out).
    Test {
        /// Passed to `cargo test` (e.g. `--test scenarios fork_chain::`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every static check, each named, all of them whatever one finds; fail at the end if
    /// any failed: rustfmt; clippy on the host crates and on leash-ebpf for its BPF target
    /// (nightly), warnings denied; ruff and `mypy --strict` on clients/python (installed pinned
    /// into target/hosts/python); `tsc` on clients/node, whose JavaScript must implement its
    /// index.d.ts (TypeScript from npm, in LEASH_HOSTS_CACHE/lint); and a check that no two
    /// files of a crate import each other, directly or round a circle.
    Lint,
    /// Build the integration tests and run them on other kernels, under QEMU (as root).
    ///
    /// The kernels are Debian's cloud kernels of bullseye (5.10), bookworm (6.1) and trixie
    /// (6.12), and the newest Debian ships (sid-newest: unstable's, or experimental's when
    /// newer, looked up at each run); bookworm's 6.12 runs only with --kernel bookworm-6.12
    /// (the same upstream line as trixie's). Each is booted under QEMU (KVM where it works, TCG
    /// otherwise) with an initramfs of the test binary. With --arch arm64: Debian's arm64
    /// cloud kernels of bookworm (6.1) and trixie (6.12), emulated, with leash and the tests
    /// cross-built and a subset of the scenarios (--all for every one). Prints every test's
    /// output, one line per kernel and the total; fails if a test fails on any kernel.
    /// Installs QEMU, busybox and the cross toolchain when missing, and caches the kernels in
    /// /var/cache/leash-vmtest (LEASH_VMTEST_CACHE=DIR to change it).
    Vmtest(vmtest::Options),
    /// Make the Debian userlands the package's tests use (Debian 11 and 13, and 12 with systemd)
    /// with mmdebstrap, those not cached yet, all at once; cached in
    /// /var/cache/leash-vmtest/userlands (LEASH_VMTEST_CACHE=DIR to change it).
    Userlands,
    /// The Debian package under a real systemd (as root): a Debian 12 guest, booted under QEMU
    /// with systemd as PID 1, installs the package, upgrades it while a tree runs (the daemon
    /// hands over; the tree stays tracked), has its daemon SIGKILLed and restarted, scores the
    /// unit, reads the journal, removes and purges it. The userland is made with debootstrap
    /// once and cached in /var/cache/leash-vmtest/userlands.
    Systemtest(systemtest::Options),
    /// Set up, build with optimizations, and run every benchmark side by side with its
    /// references, writing BENCHMARKS.md (as root). With --arch arm64: only the overhead
    /// section, in an arm64 guest under emulation (as `vmtest --arch arm64` boots one), with
    /// leash and the benchmarks cross-built; its ratios (no times: emulation inflates them)
    /// become BENCHMARKS.md's section "Overhead on arm64 (emulated)", which the x86 runs keep.
    Bench {
        /// A few minutes: fewer repetitions, smaller sizes.
        #[arg(long)]
        quick: bool,
        /// Where the benchmarks run: x86_64, this machine; or arm64, emulated (the overhead
        /// section only).
        #[arg(long, value_enum, default_value_t = cross::Arch::X86_64)]
        arch: cross::Arch,
        /// With --arch arm64, the kernel the guest boots (a name `vmtest --arch arm64 --list`
        /// gives); trixie-6.12 when absent.
        #[arg(long, value_name = "NAME")]
        kernel: Option<String>,
    },
    /// Set up, build, and run the `leash` binary with these arguments (as root).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build with optimizations, and install the service: the binary as PREFIX/bin/leash
    /// and the systemd unit dist/leash.service (restarted whenever it dies) as
    /// /etc/systemd/system/leash.service, with the man pages (PREFIX/share/man/man1) and the
    /// bash, zsh and fish completions (under PREFIX/share). Starts nothing; it prints how.
    Install {
        /// Where the binary goes: PREFIX/bin/leash (and the pages and completions under
        /// PREFIX/share).
        #[arg(long, default_value = "/usr/local")]
        prefix: PathBuf,
        /// Put every file under this directory instead of / (for packaging).
        #[arg(long)]
        destdir: Option<PathBuf>,
    },
    /// Set up, install cargo-fuzz if needed, build the fuzz targets in fuzz/ and run each for a
    /// bounded time (as root: the `connection` target runs the daemon core). Fails if a target
    /// crashes, and says where the crashing input is.
    Fuzz {
        /// How long each target runs.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// `request` or `connection`; both if absent.
        target: Option<String>,
    },
    /// Build the image of dist/Containerfile with podman (as root; installs podman if missing):
    /// the runtime stage, from the release binary and the C libraries it links staged here as
    /// the build stage would. With --check, run it as the Kubernetes DaemonSet does and check
    /// that it enforces a tree on this machine, hands over on `podman stop` and that the next
    /// container takes over; PASS or FAIL and the time taken for each.
    Image(image::Options),
    /// Build the `leash` binary that ships and stage it, with the unit, man pages, completions
    /// and docs, in target/dist/leash-VERSION-x86_64-linux/ (bin/, lib/systemd/system/,
    /// share/), or leash-VERSION-aarch64-linux/ with `--target aarch64`. Prints the binary's
    /// size, the oldest glibc it runs on, and its newest glibc symbol version.
    ///
    /// The binary is linked by zig (PyPI's `cargo-zigbuild` and `ziglang`, both prebuilt,
    /// installed into target/dist/zig-venv) against glibc 2.31, so it runs
    /// on Debian 11, Ubuntu 20.04 and anything newer; built on this machine as usual it would
    /// need the build machine's glibc (2.34 and up). The task fails if any symbol needs a
    /// newer glibc than 2.31. Why glibc 2.31 through zig rather than a static musl binary:
    /// musl has no std here (only x86_64-unknown-linux-gnu is installed), so the daemon that
    /// ships would be built with nightly's `-Z build-std`; the daemon returns freed memory to
    /// the kernel with `malloc_trim`, which only glibc has, and the memory it holds when idle
    /// is a goal of its own; musl's allocator is slower under the daemon's many small
    /// allocations unless another allocator is linked in, which makes the binary bigger; and
    /// glibc is on every machine leash runs on. The eBPF programs are still built by
    /// leash-user's build script (nightly, bpf-linker) and embedded.
    ///
    /// x86_64 is built with stable. aarch64 is cross-built the same way (zig, glibc 2.31) but
    /// with nightly and `-Z build-std`, since stable has no aarch64 std here; it is checked
    /// under qemu-user (`qemu-aarch64-static -L /usr/aarch64-linux-gnu`).
    Dist(dist::Options),
    /// Build the Debian package target/debian/leash_VERSION_amd64.deb (or _arm64.deb with
    /// `--target aarch64`) from the dist staging
    /// (building it first, as `cargo xtask dist`), with cargo-deb (built from crates.io's
    /// source when missing: about a minute, once) and the maintainer scripts of dist/debian/,
    /// which hand the running daemon's trees over on upgrade rather than restarting it
    /// (docs/DEPLOY.md, *Installing the package*). Ends with the `apt install` command that
    /// installs the package, its path in it.
    Deb(dist::deb::Options),
    /// Build the host libraries' packages into target/packages/: the pure Python wheel, a
    /// platform wheel carrying each `leash` binary `cargo xtask dist` staged
    /// (py3-none-manylinux_2_31_x86_64, ..._aarch64), the `leash-client` npm tarball (which
    /// names the platform packages as optional dependencies) and a platform npm package per
    /// binary (leash-client-linux-x64, leash-client-linux-arm64). Prints each file's size.
    Packages(packages::Options),
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::Setup => setup(),
        Task::Test { args } => test(&args),
        Task::Lint => lint::lint(),
        Task::Vmtest(options) => vmtest::vmtest(&options),
        Task::Systemtest(options) => systemtest::systemtest(&options),
        Task::Userlands => userland::userlands(),
        Task::Run { args } => run(&args),
        Task::Bench {
            quick,
            arch,
            kernel,
        } => match (arch, kernel) {
            (cross::Arch::X86_64, None) => bench(quick),
            (cross::Arch::X86_64, Some(_)) => Err(anyhow::anyhow!(
                "--kernel is for --arch arm64: the x86 benchmarks run on this machine's kernel"
            )),
            (cross::Arch::Aarch64, kernel) => vmtest::bench_guest::bench(
                kernel
                    .as_deref()
                    .unwrap_or(vmtest::bench_guest::DEFAULT_KERNEL),
                quick,
                &workspace_root().join("BENCHMARKS.md"),
            ),
        },
        Task::Install { prefix, destdir } => install(&prefix, destdir.as_deref()),
        Task::Fuzz { seconds, target } => fuzz::fuzz(seconds, target.as_deref()),
        Task::Image(options) => image::image(&options),
        Task::Dist(options) => dist::dist(&options),
        Task::Deb(options) => dist::deb::deb(&options),
        Task::Packages(options) => packages::packages(&options),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn setup() -> Result<()> {
    ensure_nightly_rust_src()?;
    ensure_bpf_linker()?;
    Ok(())
}

/// The live view's test drives a real terminal in tmux.
fn ensure_tmux() -> Result<()> {
    if output(Command::new("tmux").arg("-V")).is_ok() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!("the tests need tmux; install it (Debian/Ubuntu: apt-get install tmux)");
    }
    apt_install(&["tmux"], true)
}

/// The tests of the systemd unit and of the daemon under its restrictions: systemd-analyze
/// (verify, security, syscall-filter), Python's seccomp module, and util-linux's prlimit,
/// setpriv and unshare.
fn ensure_unit_test_tools() -> Result<()> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut missing = Vec::new();
    if !works("systemd-analyze", &["--version"]) {
        missing.push("systemd");
    }
    if !works("/usr/bin/python3", &["-c", "import seccomp"]) {
        missing.push("python3-seccomp");
    }
    if !works("prlimit", &["--version"]) || !works("setpriv", &["--version"]) {
        missing.push("util-linux");
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!(
            "the tests need {}; install them (Debian/Ubuntu: apt-get install {0}), or set \
             LEASH_TEST_SKIP_SYSTEMD=1 to skip the tests of the systemd unit",
            missing.join(" ")
        );
    }
    apt_install(&missing, true)
}

fn test(args: &[String]) -> Result<()> {
    setup()?;
    ensure_tmux()?;
    if !env::var("LEASH_TEST_SKIP_SYSTEMD").is_ok_and(|v| v == "1") {
        ensure_unit_test_tools()?;
    }
    hosts::prepare()?;
    if !is_root() {
        eprintln!(
            "xtask: warning: not root; the integration tests will fail to load BPF. \
             Run as root (or set LEASH_TEST_SKIP_BPF=1 to skip them on purpose)."
        );
    }
    remove_stale_test_pins();
    cargo(&["build"])?;
    let mut test_args = vec!["test"];
    test_args.extend(args.iter().map(String::as_str));
    cargo_test_with_summary(&test_args)
}

/// Runs `cargo test`, passing its output through, and ends with one line that totals every
/// test binary's result (`tests: N passed, M failed`), so the outcome is not buried among the
/// per-binary summaries.
fn cargo_test_with_summary(args: &[&str]) -> Result<()> {
    let mut child = cargo_command()
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        if let Some(result) = line.strip_prefix("test result: ") {
            passed += count_before(result, " passed");
            failed += count_before(result, " failed");
            ignored += count_before(result, " ignored");
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if !status.success() {
        bail!("cargo test failed: {status}");
    }
    Ok(())
}

/// In "ok. 3 passed; 0 failed; ...", the number before `word`.
pub(crate) fn count_before(result: &str, word: &str) -> u64 {
    result
        .split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(word)
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

fn bench(quick: bool) -> Result<()> {
    setup()?;
    cargo(&[
        "build",
        "--release",
        "--package",
        "leash-user",
        "--package",
        "leash-bench",
    ])?;
    let root = workspace_root();
    let report = root.join("BENCHMARKS.md");
    // leash-bench writes the report whole: the sections it cannot measure here (arm64's, and
    // the emulated 7.x guests') are put back as they were.
    let old = std::fs::read_to_string(&report).unwrap_or_default();
    let kept: Vec<(&str, String)> = bench_section::KEPT
        .into_iter()
        .filter_map(|title| Some((title, bench_section::existing(&old, title)?.to_owned())))
        .collect();
    let mut bench = Command::new(root.join("target/release/leash-bench"));
    bench.arg("--out").arg(&report);
    if quick {
        bench.arg("--quick");
    }
    let ran = status(&mut bench);
    if !kept.is_empty()
        && let Ok(mut new) = std::fs::read_to_string(&report)
    {
        for (title, section) in &kept {
            new = bench_section::splice(&new, title, section);
        }
        std::fs::write(&report, new).with_context(|| format!("writing {}", report.display()))?;
    }
    ran
}

fn run(args: &[String]) -> Result<()> {
    setup()?;
    cargo(&["build", "--package", "leash-user"])?;
    let leash = workspace_root().join("target/debug/leash");
    status(Command::new(&leash).args(args))
}

fn install(prefix: &Path, destdir: Option<&Path>) -> Result<()> {
    if !prefix.is_absolute() {
        bail!("--prefix must be an absolute path: {}", prefix.display());
    }
    setup()?;
    cargo(&["build", "--release", "--package", "leash-user"])?;
    let root = workspace_root();
    let staged = |path: &Path| match destdir {
        Some(dest) => dest.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    };
    let binary = prefix.join("bin/leash");
    let unit = Path::new("/etc/systemd/system/leash.service");

    let target = staged(&binary);
    std::fs::create_dir_all(target.parent().context("a directory")?)?;
    // Through a new file and a rename: the running daemon's binary may be the old one.
    let partial = target.with_extension("partial");
    std::fs::copy(root.join("target/release/leash"), &partial)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &target)?;
    eprintln!("xtask: installed {}", target.display());
    install_docs(&root.join("target/release/leash"), prefix, &staged)?;

    let template = std::fs::read_to_string(root.join("dist/leash.service"))?;
    let target = staged(unit);
    std::fs::create_dir_all(target.parent().context("a directory")?)?;
    std::fs::write(&target, unit_for(&template, &binary)?)
        .with_context(|| format!("writing {}", target.display()))?;
    eprintln!("xtask: installed {}", target.display());
    if destdir.is_none() {
        eprintln!("xtask: start it with: systemctl daemon-reload && systemctl enable --now leash");
    }
    Ok(())
}

/// The man pages and the shell completions, as the binary just built generates them.
fn install_docs(leash: &Path, prefix: &Path, staged: &dyn Fn(&Path) -> PathBuf) -> Result<()> {
    let man = staged(&prefix.join("share/man/man1"));
    let pages = output(Command::new(leash).arg("manpages").arg(&man))?;
    eprintln!(
        "xtask: installed {} man pages in {}",
        pages.lines().count(),
        man.display()
    );
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/leash"),
        ("zsh", "share/zsh/vendor-completions/_leash"),
        ("fish", "share/fish/vendor_completions.d/leash.fish"),
    ] {
        let script = output(Command::new(leash).args(["completions", shell]))?;
        let target = staged(&prefix.join(path));
        std::fs::create_dir_all(target.parent().context("a directory")?)?;
        std::fs::write(&target, script).with_context(|| format!("writing {}", target.display()))?;
        eprintln!("xtask: installed {}", target.display());
    }
    Ok(())
}

/// The unit file, with ExecStart running `binary`.
fn unit_for(template: &str, binary: &Path) -> Result<String> {
    let exec = "ExecStart=/usr/local/bin/leash ";
    if !template.contains(exec) {
        bail!("dist/leash.service has no line starting with {exec:?}");
    }
    Ok(template.replace(exec, &format!("ExecStart={} ", binary.display())))
}

fn ensure_nightly_rust_src() -> Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    match installed {
        Ok(list) if list.lines().any(|l| l.starts_with("rust-src")) => Ok(()),
        Ok(_) => {
            eprintln!("xtask: adding rust-src to the nightly toolchain");
            status(Command::new("rustup").args([
                "component",
                "add",
                "rust-src",
                "--toolchain",
                "nightly",
            ]))
        }
        Err(e) => bail!(
            "the eBPF programs build with a nightly toolchain and none is usable ({e:#}); \
             install one with: rustup toolchain install nightly --component rust-src"
        ),
    }
}

fn ensure_bpf_linker() -> Result<()> {
    let version = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    let llvm_prefix = PathBuf::from(format!("/usr/lib/llvm-{LLVM_MAJOR}"));
    if !llvm_prefix.join("bin/llvm-config").exists() {
        install_llvm()?;
    }
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR}");
    status(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                &format!("llvm-{LLVM_MAJOR}"),
            ])
            // Without it bpf-linker's build looks for LLVM in /usr and fails on -lLLVM.
            .env("LLVM_PREFIX", &llvm_prefix),
    )
}

fn install_llvm() -> Result<()> {
    let packages = [
        format!("llvm-{LLVM_MAJOR}-dev"),
        format!("libpolly-{LLVM_MAJOR}-dev"),
        "libzstd-dev".to_owned(),
    ];
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!(
            "bpf-linker needs LLVM {LLVM_MAJOR} development files. On Debian/Ubuntu, as root: \
             apt-get install {}; elsewhere install LLVM {LLVM_MAJOR} and run \
             LLVM_PREFIX=<its prefix> cargo install bpf-linker --version {BPF_LINKER_VERSION} \
             --no-default-features --features llvm-{LLVM_MAJOR}",
            packages.join(" ")
        );
    }
    apt_install(&packages.each_ref().map(String::as_str), true)
}

/// Installs `packages` with apt (refreshing its lists first), with their recommended packages
/// or without.
fn apt_install(packages: &[&str], recommends: bool) -> Result<()> {
    if !Path::new("/usr/bin/apt-get").exists() || !is_root() {
        bail!(
            "{} missing; install it as root (Debian/Ubuntu: apt-get install {0})",
            packages.join(" ")
        );
    }
    eprintln!("xtask: installing {}", packages.join(" "));
    status(Command::new("apt-get").args(["update", "-qq"]))?;
    let mut install = Command::new("apt-get");
    install.args(["install", "-y", "-qq"]);
    if !recommends {
        install.arg("--no-install-recommends");
    }
    status(
        install
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Test daemons pin under /sys/fs/bpf/leash-test-PID-N and remove that when dropped. A test
/// process that was itself killed leaves its pins, and their programs attached: remove those of
/// test processes that are gone.
fn remove_stale_test_pins() {
    let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("leash-test-")
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            eprintln!("xtask: removing stale test pins {}", entry.path().display());
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

fn cargo(args: &[&str]) -> Result<()> {
    status(cargo_command().args(args))
}

/// Cargo (the one that runs xtask, else `cargo` on PATH), in the workspace's root.
fn cargo_command() -> Command {
    let mut command = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(workspace_root());
    command
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0")
}

fn status(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("running {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Calls `ready` until it returns something, for at most `timeout`.
pub fn poll<T>(
    timeout: std::time::Duration,
    what: &str,
    mut ready: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = ready()? {
            return Ok(value);
        }
        if std::time::Instant::now() > deadline {
            bail!("waited {} s for {what}", timeout.as_secs());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Installs `cargo-SUBCOMMAND` at `version` from crates.io (built with `+TOOLCHAIN` if given)
/// unless `cargo-SUBCOMMAND --version` already names that version. crates.io has sources only:
/// the build takes about `minutes` (measured on 2 cores), said before it starts.
pub fn ensure_cargo_subcommand(
    toolchain: Option<&str>,
    subcommand: &str,
    version: &str,
    minutes: u32,
) -> Result<()> {
    let krate = format!("cargo-{subcommand}");
    let installed = output(Command::new(&krate).arg("--version")).unwrap_or_default();
    if installed.contains(version) {
        return Ok(());
    }
    eprintln!("xtask: building {krate} {version} from source (about {minutes} min, once)");
    status(
        Command::new("cargo")
            .args(toolchain.map(|t| format!("+{t}")))
            .args(["install", "--locked", &krate, "--version", version]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_the_installed_binary() {
        let template =
            std::fs::read_to_string(workspace_root().join("dist/leash.service")).unwrap();
        let unit = unit_for(&template, Path::new("/opt/leash/bin/leash")).unwrap();
        assert!(
            unit.contains("\nExecStart=/opt/leash/bin/leash daemon\n"),
            "{unit}"
        );
        assert!(unit.contains("\nRestart=always\n"));
        assert!(unit_for("[Service]\n", Path::new("/x")).is_err());
    }
}
