//! Builds the eBPF programs (leash-ebpf) with the nightly toolchain and bpf-linker, so the
//! `leash` binary embeds them. `AYA_BUILD_SKIP=1` skips this (for clippy without the toolchain).
//!
//! Also names the commit the binary is built from and the pins' ABI, for `leash --version`:
//! `LEASH_COMMIT` and `LEASH_ABI`.
use std::{path::Path, process::Command};

use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    println!(
        "cargo:rustc-env=LEASH_COMMIT={}",
        commit(Path::new(workspace))
    );
    // As a literal, for `concat!`: the pins' ABI, which `--version` names too.
    println!("cargo:rustc-env=LEASH_ABI={}", leash_common::ABI_VERSION);
    let ebpf = Package {
        name: "leash-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-ebpf"),
        ..Default::default()
    };
    // aya-build watches leash-ebpf; the programs also embed the ABI from leash-common.
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../leash-common/src")
    );
    aya_build::build_ebpf([ebpf], Toolchain::default())
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
