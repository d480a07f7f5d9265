//! Builds the eBPF programs (leash-ebpf) with the nightly toolchain and bpf-linker, so the
//! `leash` binary embeds them. `AYA_BUILD_SKIP=1` skips this, for an editor (rust-analyzer
//! runs build scripts) or clippy on a machine without that toolchain: the objects are then
//! empty, the workspace builds, and the binary says at load time that it carries no programs.
//!
//! Also names the commit the binary is built from and the pins' ABI, for `leash --version`:
//! `LEASH_COMMIT` and `LEASH_ABI`.
//!
//! The nested build (aya-build's `cargo build` of leash-ebpf) writes its output to
//! OUT_DIR/ebpf-build.log. aya-build would pass each of its lines on as a `cargo:warning`, and
//! cargo replays a build script's warnings on every later build that does not rerun it: dozens
//! of lines on each no-op build. So aya-build runs in a child process (this script again, with
//! [`CHILD`] set), whose warnings go to the log and whose other directives (what to watch) go
//! on to cargo. A failure shows the log's last lines.
use std::{
    env,
    fs::{self, File, OpenOptions},
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, bail};
use aya_build::{Package, Toolchain};

/// Set in the child that runs aya-build.
const CHILD: &str = "LEASH_BUILD_SCRIPT_RUNS_AYA_BUILD";
/// How much of the log a failure shows.
const TAIL_LINES: usize = 40;

fn main() -> anyhow::Result<()> {
    if env::var_os(CHILD).is_some() {
        let ebpf = Package {
            name: "leash-ebpf",
            root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-ebpf"),
            ..Default::default()
        };
        return aya_build::build_ebpf([ebpf], Toolchain::default());
    }
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    println!(
        "cargo:rustc-env=LEASH_COMMIT={}",
        commit(Path::new(workspace))
    );
    // As a literal, for `concat!`: the pins' ABI, which `--version` names too.
    println!("cargo:rustc-env=LEASH_ABI={}", leash_common::ABI_VERSION);
    // aya-build watches leash-ebpf; the programs also embed the ABI from leash-common.
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-common/src")
    );
    println!("cargo:rerun-if-env-changed={AYA_BUILD_SKIP}");
    if skipped() {
        return write_empty_objects();
    }
    build_ebpf()
}

/// What skips the eBPF build, as aya-build reads it.
const AYA_BUILD_SKIP: &str = "AYA_BUILD_SKIP";

/// The objects the `leash` binary embeds (leash-ebpf's two binaries).
const OBJECTS: [&str; 2] = ["leash-ebpf", "leash-ebpf-marks"];

/// Whether `AYA_BUILD_SKIP` is `1` or `true`, as aya-build takes it.
fn skipped() -> bool {
    env::var_os(AYA_BUILD_SKIP)
        .is_some_and(|value| value == "1" || value.eq_ignore_ascii_case("true"))
}

/// Under `AYA_BUILD_SKIP`: empty objects where the built ones would be, so that the binary
/// builds (it embeds them), and one warning.
fn write_empty_objects() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("cargo sets OUT_DIR")?);
    for object in OBJECTS {
        let path = out_dir.join(object);
        fs::write(&path, b"").with_context(|| format!("writing {}", path.display()))?;
    }
    println!(
        "cargo:warning={AYA_BUILD_SKIP} is set: the eBPF programs are not built, and this \
         leash cannot load any"
    );
    Ok(())
}

/// Runs aya-build in a child, its output to OUT_DIR/ebpf-build.log.
fn build_ebpf() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("cargo sets OUT_DIR")?);
    let log_path = out_dir.join("ebpf-build.log");
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    announce(&log_path);
    let mut child = Command::new(env::current_exe().context("this build script's path")?)
        .env(CHILD, "1")
        // Its error in one line, not a backtrace filling the log's tail.
        .env("RUST_LIB_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?)
        .spawn()
        .context("running aya-build in a child")?;
    let stdout = BufReader::new(child.stdout.take().context("the child's stdout")?);
    for line in stdout.lines() {
        let line = line.context("reading aya-build's output")?;
        match line.strip_prefix("cargo:warning=") {
            Some(text) => writeln!(log, "{text}")?,
            None => println!("{line}"),
        }
    }
    let status = child.wait().context("waiting for aya-build")?;
    if !status.success() {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        // Cargo shows a failed build script's stderr.
        for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
            eprintln!("{line}");
        }
        bail!(
            "building the eBPF programs (leash-ebpf, nightly, bpf-linker) failed ({status}): \
             its last lines are above, all of them in {}",
            log_path.display()
        );
    }
    Ok(())
}

/// One line on the terminal, when there is one, as the nested build starts: it takes a minute
/// or more the first time, while cargo shows only `leash-user(build)`. Written to the terminal
/// itself because a build script's own output reaches the terminal only as warnings, which
/// cargo prints when the script ends and replays on every build after. Written only when the
/// script runs, so a no-op build prints nothing.
fn announce(log: &Path) {
    if let Ok(mut tty) = OpenOptions::new().write(true).open("/dev/tty") {
        // Over cargo's progress bar, which it draws again below.
        let _ = write!(
            tty,
            "\r\x1b[K   Building the eBPF programs (leash-ebpf: nightly, bpf-linker), \
             log: {}\n",
            log.display()
        );
    }
}

/// The commit checked out in `workspace` (12 hex digits), with `-dirty` if the tree differs
/// from it, or `unknown` outside a git checkout (a source tarball, or no git installed).
///
/// The script runs again when HEAD moves (a commit, a checkout) or the index changes (an
/// add, a commit): not on every build. An edit to a clean tree shows as `-dirty` at the next
/// commit or add, not before.
fn commit(workspace: &Path) -> String {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(workspace)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // A tarball unpacked inside some other repository is not that repository's commit.
    let ours = git(&["rev-parse", "--show-toplevel"])
        .and_then(|top| Path::new(&top).canonicalize().ok())
        .is_some_and(|top| workspace.canonicalize().is_ok_and(|w| w == top));
    if !ours {
        return "unknown".to_owned();
    }
    // Git's own files, wherever they are (a worktree keeps HEAD apart from the refs).
    for file in ["HEAD", "index", "packed-refs"] {
        watch(git(&[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            file,
        ]));
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch(git(&[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            &branch,
        ]));
    }
    let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return "unknown".to_owned();
    };
    // Untracked files do not count: the build does not read what git does not know of. No
    // optional locks: `status` would otherwise refresh the index, which this script watches.
    match git(&[
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]) {
        Some(changes) if changes.is_empty() => hash,
        _ => format!("{hash}-dirty"),
    }
}

fn watch(path: Option<String>) {
    if let Some(path) = path.filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
}
