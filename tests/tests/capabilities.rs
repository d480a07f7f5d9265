//! The daemon with only the capabilities dist/leash.service leaves it (its
//! `CapabilityBoundingSet=`), unable to gain any other (`NoNewPrivileges=`): it loads and pins
//! its programs, takes a tree of another user on a leash, and kills it when the host is
//! SIGKILLed. This is what shows the unit's bounding set is enough.

use std::{fs, process::Command, time::Duration};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A},
};

const UNIT: &str = include_str!("../../dist/leash.service");
/// A tree that outlives a SIGTERM: only the daemon's SIGKILL, across users, ends it.
const STUBBORN_AGENT: &str = r#"trap "" TERM HUP; sleep 600 & exec sleep 600"#;

#[test]
fn the_daemon_keeps_another_users_tree_on_a_leash_with_only_the_units_capabilities() {
    let capabilities = unit_capabilities();
    let bounding = capabilities
        .iter()
        .map(|name| format!("+{name}"))
        .collect::<Vec<_>>()
        .join(",");
    let Some(daemon) = Daemon::start_wrapped(
        &[
            "setpriv",
            "--inh-caps=-all",
            &format!("--bounding-set=-all,{bounding}"),
            "--no-new-privs",
            "--",
        ],
        &[],
    ) else {
        return;
    };
    let allowed = mask_of(&capabilities);
    let status = fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    for field in ["CapBnd", "CapEff", "CapPrm"] {
        let held = capability_field(&status, field);
        assert_eq!(
            held & !allowed,
            0,
            "the daemon holds capabilities outside the unit's bounding set ({field}: {held:x}, \
             allowed {allowed:x})"
        );
    }
    assert_eq!(
        capability_field(&status, "NoNewPrivs"),
        1,
        "no_new_privs is set"
    );

    let cgroup = Cgroup::new("capabilities");
    let mut host = daemon
        .leash_as(
            USER_A,
            &cgroup,
            &["run", "--grace", "100ms", "--", "sh", "-c", STUBBORN_AGENT],
        )
        .spawn()
        .unwrap();
    let settled = cgroup.settle(3, &["leash", "sleep"]);
    for pid in &settled {
        let uid = fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|status| {
                let line = status.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
                line.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        assert_eq!(uid, Some(USER_A), "process {pid} runs as the other user");
    }

    host.kill().unwrap();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    let _ = host.wait();
    eprintln!(
        "capabilities {capabilities:?}: another user's tree was empty {emptied:?} after its \
         host was SIGKILLed"
    );
    assert!(
        emptied.is_some(),
        "the tree outlived its host: the daemon lacks a capability it needs:\n{}",
        daemon.log()
    );
}

/// The capabilities the unit's `CapabilityBoundingSet=` lines keep, as setpriv names them
/// (`bpf` for CAP_BPF).
fn unit_capabilities() -> Vec<String> {
    let capabilities: Vec<String> = UNIT
        .lines()
        .filter_map(|line| line.trim().strip_prefix("CapabilityBoundingSet="))
        .flat_map(str::split_whitespace)
        .map(|name| {
            name.strip_prefix("CAP_")
                .unwrap_or_else(|| panic!("{name} in CapabilityBoundingSet= is not CAP_*"))
                .to_lowercase()
        })
        .collect();
    assert!(
        !capabilities.is_empty(),
        "dist/leash.service has no CapabilityBoundingSet="
    );
    capabilities
}

/// The bit mask of capabilities `names`: each one's number is its place in `setpriv
/// --list-caps`, which lists them in the kernel's order.
fn mask_of(names: &[String]) -> u64 {
    let output = Command::new("setpriv")
        .arg("--list-caps")
        .output()
        .expect("running setpriv --list-caps");
    let known: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    names.iter().fold(0, |mask, name| {
        let number = known
            .iter()
            .position(|known| known == name)
            .unwrap_or_else(|| panic!("setpriv does not know capability {name}"));
        mask | 1 << number
    })
}

/// A number field of /proc/PID/status: capability sets are hexadecimal, the rest decimal.
fn capability_field(status: &str, field: &str) -> u64 {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"))
        .trim();
    let radix = if field.starts_with("Cap") { 16 } else { 10 };
    u64::from_str_radix(value, radix).unwrap()
}
