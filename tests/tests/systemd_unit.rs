//! dist/leash.service as systemd reads it: `systemd-analyze verify` finds nothing wrong with it,
//! and `systemd-analyze security` rates it at most [`MAX_EXPOSURE`] (its scale runs from 0,
//! nothing exposed, to 10; "OK" is below 4.5). Both work without systemd running.
//! Where systemd-analyze is missing the test fails, unless LEASH_TEST_SKIP_SYSTEMD=1 says to
//! skip it.
//!
//! The Debian package's unit (`cargo xtask deb`) is the same file with ExecStart running
//! /usr/bin/leash: every check runs on both.
//!
//! That the daemon works under the unit's restrictions is capabilities.rs's part.

use std::{fs, path::Path, process::Command};

use leash_tests::{Removed, leash_binary};

const UNIT: &str = include_str!("../../dist/leash.service");
/// Where `cargo xtask deb` lays out the amd64 package's unit.
const PACKAGED_UNIT: &str = "target/debian/cargo-deb/x86_64-unknown-linux-gnu/release/root/lib/systemd/system/leash.service";
/// The opt-out where systemd-analyze cannot be had.
const SKIP_VAR: &str = "LEASH_TEST_SKIP_SYSTEMD";
/// The exposure the unit may have: what it has today (2.0). Raise it only with a reason.
const MAX_EXPOSURE: f64 = 2.0;

#[test]
fn systemd_finds_the_unit_valid_and_well_hardened() {
    if !systemd_analyze_found() {
        return;
    }
    for (name, text) in units() {
        eprintln!("{name}:");
        verify_and_rate(&text);
    }
}

/// dist/leash.service, and the package's unit.
fn units() -> [(&'static str, String); 2] {
    [
        ("dist/leash.service", UNIT.to_owned()),
        ("the package's unit", packaged_unit()),
    ]
}

/// The unit the Debian package installs: dist/leash.service running /usr/bin/leash.
fn packaged_unit() -> String {
    with_exec_start(UNIT, Path::new("/usr/bin/leash"))
}

#[test]
fn the_packaged_unit_is_the_unit_with_the_package_s_binary() {
    let unit = packaged_unit();
    assert!(unit.contains("\nExecStart=/usr/bin/leash daemon\n"));
    assert_eq!(unit.lines().count(), UNIT.lines().count());
    // The package's, where `cargo xtask deb` has laid it out.
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(PACKAGED_UNIT);
    if let Ok(built) = fs::read_to_string(&built) {
        assert_eq!(
            built, unit,
            "{PACKAGED_UNIT} differs from dist/leash.service"
        );
    }
}

fn verify_and_rate(text: &str) {
    let dir = Removed(std::env::temp_dir().join(format!("leash-test-unit-{}", std::process::id())));
    fs::create_dir_all(&dir.0).unwrap();
    // Named as installed, and running the binary under test (verify checks it exists).
    let unit = dir.0.join("leash.service");
    fs::write(&unit, with_exec_start(text, &leash_binary())).unwrap();

    let verify = analyze(&["verify", path_str(&unit)]);
    let complaints: Vec<&str> = verify
        .stderr
        .lines()
        .filter(|line| line.contains("leash.service"))
        .collect();
    assert!(
        verify.success && complaints.is_empty(),
        "systemd-analyze verify: {}\n{}",
        verify.stdout,
        verify.stderr
    );

    let security = analyze(&["security", "--offline=yes", path_str(&unit)]);
    let exposure = security
        .stdout
        .lines()
        .find_map(|line| {
            line.split("Overall exposure level for leash.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure level in systemd-analyze security's output:\n{}\n{}",
                security.stdout, security.stderr
            )
        });
    eprintln!("systemd-analyze security: exposure {exposure}");
    assert!(
        exposure <= MAX_EXPOSURE,
        "the unit's exposure is {exposure}, above {MAX_EXPOSURE}:\n{}",
        security.stdout
    );
}

#[test]
fn the_units_keep_what_the_daemon_needs() {
    for (name, unit) in units() {
        eprintln!("{name}:");
        keeps_what_the_daemon_needs(&unit);
    }
}

fn keeps_what_the_daemon_needs(unit: &str) {
    let settings: Vec<(&str, &str)> = unit
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .collect();
    let values = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| *k == key)
            .flat_map(|(_, v)| v.split_whitespace())
            .collect()
    };
    // The pins: on the host's bpffs, writable (ProtectKernelTunables= would make /sys/fs/bpf
    // read-only whatever ReadWritePaths= says).
    assert!(values("ReadWritePaths").contains(&"/sys/fs/bpf"));
    assert!(!values("ProtectKernelTunables").contains(&"yes"));
    // The socket's directory, world-reachable, kept across a restart or hand-over.
    assert_eq!(values("RuntimeDirectory"), ["leash"]);
    assert_eq!(values("RuntimeDirectoryMode"), ["0755"]);
    assert_eq!(values("RuntimeDirectoryPreserve"), ["restart"]);
    // Room for many connections.
    let nofile: u64 = values("LimitNOFILE")[0].parse().unwrap();
    assert!(nofile >= 65536, "LimitNOFILE={nofile}");
    // The system calls the daemon makes beyond a service's usual ones.
    let filter = values("SystemCallFilter");
    for call in ["@system-service", "bpf", "mount", "perf_event_open"] {
        assert!(filter.contains(&call), "SystemCallFilter= lacks {call}");
    }
    // A kernel that cannot run leash makes the daemon exit 78, and no restart changes that.
    assert_eq!(values("RestartPreventExitStatus"), ["78"]);
}

/// The unit with ExecStart running `binary` (instead of /usr/local/bin/leash, or whatever it
/// ran).
fn with_exec_start(unit: &str, binary: &Path) -> String {
    let mut replaced = 0;
    let lines: Vec<String> = unit
        .lines()
        .map(|line| match line.strip_prefix("ExecStart=") {
            Some(command) => {
                replaced += 1;
                let (_, args) = command.split_once(' ').expect("ExecStart= with arguments");
                format!("ExecStart={} {args}", path_str(binary))
            }
            None => line.to_owned(),
        })
        .collect();
    assert_eq!(replaced, 1, "not one ExecStart= line in the unit");
    lines.join("\n") + "\n"
}

fn systemd_analyze_found() -> bool {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: systemd-analyze is not installed and {SKIP_VAR}=1");
        return false;
    }
    panic!(
        "systemd-analyze is not installed, so the unit cannot be checked. Install it \
         (Debian/Ubuntu: apt-get install systemd; cargo xtask test does), or set {SKIP_VAR}=1 \
         to skip this test on purpose."
    );
}

struct Analyzed {
    success: bool,
    stdout: String,
    stderr: String,
}

fn analyze(args: &[&str]) -> Analyzed {
    let output = Command::new("systemd-analyze")
        .args(args)
        .output()
        .expect("running systemd-analyze");
    Analyzed {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
