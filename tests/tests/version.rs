//! What the binary says about itself: `leash --version` names the commit and the pins' ABI, and
//! the man pages and shell completions generated from its command line are well formed (what
//! `cargo xtask install` installs).

use std::{
    path::Path,
    process::{Command, Output},
};

use leash_tests::leash_binary;

fn leash(args: &[&str]) -> Output {
    let output = Command::new(leash_binary()).args(args).output().unwrap();
    assert!(
        output.status.success(),
        "leash {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn version_names_the_commit_and_the_pins_abi() {
    let out = String::from_utf8(leash(&["--version"]).stdout).unwrap();
    let line = out.trim();
    let abi = format!(", pins ABI v{})", leash_common::ABI_VERSION);
    assert!(line.starts_with("leash 0."), "{line}");
    assert!(line.ends_with(&abi), "{line}");
    let commit = line
        .split_once("(commit ")
        .and_then(|(_, rest)| rest.split_once(','))
        .map(|(commit, _)| commit)
        .unwrap_or_else(|| panic!("no commit in {line:?}"));
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        hash == "unknown" || (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "{line}"
    );
}

#[test]
fn man_pages_are_written_for_leash_and_every_subcommand() {
    let dir = std::env::temp_dir().join(format!("leash-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    leash(&["manpages", dir.to_str().unwrap()]);
    for page in [
        "leash.1",
        "leash-run.1",
        "leash-daemon.1",
        "leash-completions.1",
    ] {
        let path = dir.join(page);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.lines().any(|line| line.starts_with(".TH ")),
            "{page} has no .TH"
        );
        readable_by_man(&path);
    }
    // Hidden from --help, and so from the pages.
    assert!(!dir.join("leash-manpages.1").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `man -l` formats the page without a warning, or groff checks it, where they are installed.
fn readable_by_man(path: &Path) {
    let name = path.file_name().unwrap().to_string_lossy();
    if let Ok(out) = Command::new("groff")
        .args(["-man", "-ww", "-z"])
        .arg(path)
        .output()
    {
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "groff on {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if let Ok(out) = Command::new("man")
        .arg("-l")
        .arg(path)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80")
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "man -l {name}");
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{text}");
    }
}

#[test]
fn completions_are_scripts_for_each_shell() {
    let bash = leash(&["completions", "bash"]).stdout;
    let check = Command::new("bash")
        .args(["-n", "-c"])
        .arg(String::from_utf8(bash.clone()).unwrap())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for (shell, script) in [
        ("bash", bash),
        ("zsh", leash(&["completions", "zsh"]).stdout),
        ("fish", leash(&["completions", "fish"]).stdout),
    ] {
        let script = String::from_utf8(script).unwrap();
        for word in ["daemon", "run", "completions"] {
            assert!(script.contains(word), "{shell} does not complete {word}");
        }
        // Only where the shell is installed: check the syntax.
        if shell != "bash"
            && let Ok(out) = Command::new(shell)
                .arg("-n")
                .arg("-c")
                .arg(&script)
                .output()
        {
            assert!(
                out.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
