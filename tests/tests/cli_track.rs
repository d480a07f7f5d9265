//! The README's main job: `leash track -- CMD` follows the whole tree, escapes included, ends
//! when the tree is empty, and exits with CMD's status.

use std::process::Command;

use leash_tests::leash_binary;

#[test]
fn track_follows_escapes_and_returns_the_command_status() {
    // Fails (or skips, on opt-out) like every BPF test when BPF cannot be loaded.
    let Some(probe) = leash_tests::tracker!() else {
        return;
    };
    drop(probe);
    let output = Command::new(leash_binary())
        .args([
            "track",
            "--",
            "sh",
            "-c",
            "setsid sleep 0.3 & (sleep 0.5 &); exit 5",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        output.status.code(),
        Some(5),
        "leash track exits with CMD's status"
    );
    let joined = stdout.lines().filter(|l| l.starts_with('+')).count();
    let left = stdout.lines().filter(|l| l.starts_with('-')).count();
    assert_eq!(
        (joined, left),
        (4, 4),
        "the root, the setsid'd sleep, the subshell and its orphan"
    );
    assert!(stdout.contains("(the root)"));
    assert!(
        stdout.contains("is empty: 1 registered, 3 joined at fork, 4 left, 0 could not be tracked"),
        "{stdout}"
    );
}
