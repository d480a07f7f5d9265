//! The daemon under the restrictions of dist/leash.service, as far as they can be set up
//! without systemd: only the capabilities of its `CapabilityBoundingSet=`, no way to gain
//! others (`NoNewPrivileges=`), only the system calls of its `SystemCallFilter=` (others fail
//! with EPERM, as `SystemCallErrorNumber=` says), and every file system read-only but
//! /sys/fs/bpf and /tmp (`ProtectSystem=strict`, `ReadOnlyPaths=/sys`, `ReadWritePaths=`;
//! /tmp stands for the private /tmp and /run/leash the daemon may write), with the unit's
//! resource limits (`LimitMEMLOCK=`, `LimitNOFILE=`: kernels before 5.11 charge BPF maps to
//! the locked-memory limit, which the daemon cannot raise itself). So restricted, it
//! loads and pins its programs, takes a tree of another user on a leash, and kills it when
//! the host is SIGKILLed. This is what shows the unit leaves the daemon what it needs.
//!
//! The system call filter needs systemd-analyze (to expand `@system-service`) and Python's
//! seccomp module; where either is missing the test fails, unless LEASH_TEST_SKIP_SYSTEMD=1,
//! which runs it without the filter.

use std::{collections::BTreeSet, fs, process::Command, time::Duration};

use leash_tests::{
    Cgroup,
    container::Container,
    daemon::{Daemon, USER_A},
    settable_limit, status_field,
};

const UNIT: &str = include_str!("../../dist/leash.service");
/// A tree that outlives a SIGTERM: only the daemon's SIGKILL, across users, ends it.
const STUBBORN_AGENT: &str = r#"trap "" TERM HUP; sleep 600 & exec sleep 600"#;
/// The opt-out where the system call filter cannot be set up.
const SKIP_VAR: &str = "LEASH_TEST_SKIP_SYSTEMD";
/// Writable in the unit (the private /tmp, and /run/leash, which the tests' daemons do not
/// use: their sockets are in /tmp) and the pins.
const WRITABLE: [&str; 2] = ["/sys/fs/bpf", "/tmp"];

/// Run as `python3 -c LAUNCHER SYSCALLS WRITABLE... -- COMMAND...` in a mount namespace of its
/// own: makes every mount but /proc's and /dev's read-only (a flag of the namespace's own
/// mounts: the rest of the system is untouched), then WRITABLE writable again, then allows
/// only SYSCALLS (comma-separated; none given: no filter), then runs COMMAND.
const LAUNCHER: &str = r#"
import errno, os, subprocess, sys
end = sys.argv.index("--")
syscalls, writable, command = sys.argv[1], sys.argv[2:end], sys.argv[end + 1:]
def remount(path, mode):
    return subprocess.run(["mount", "-o", "remount,bind," + mode, path],
                          stderr=subprocess.DEVNULL).returncode == 0
mounts = sorted({line.split()[4] for line in open("/proc/self/mountinfo")}, key=len)
for mount in mounts:
    if mount.split("/")[1] not in ("proc", "dev"):
        # Over-mounted ones cannot be reached, and need not be.
        remount(mount, "ro")
for path in writable:
    if not os.path.ismount(path):
        subprocess.run(["mount", "--bind", path, path], check=True)
    if not remount(path, "rw"):
        sys.exit("cannot make " + path + " writable")
if syscalls:
    import seccomp
    rules = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    for name in syscalls.split(","):
        try:
            rules.add_rule(seccomp.ALLOW, name)
        except Exception:
            pass  # not a system call of this architecture
    rules.load()
os.execvp(command[0], command)
"#;

#[test]
fn the_daemon_keeps_another_users_tree_on_a_leash_with_only_the_units_capabilities() {
    let capabilities = unit_capabilities();
    let bounding = capabilities
        .iter()
        .map(|name| format!("+{name}"))
        .collect::<Vec<_>>()
        .join(",");
    let syscalls = allowed_system_calls().map_or_else(String::new, |calls| {
        calls.into_iter().collect::<Vec<_>>().join(",")
    });
    let bounding = format!("--bounding-set=-all,{bounding}");
    let memlock = format!(
        "--memlock={}",
        settable_limit(unit_limit("LimitMEMLOCK"), libc::RLIMIT_MEMLOCK)
    );
    let nofile = format!(
        "--nofile={}",
        settable_limit(unit_limit("LimitNOFILE"), libc::RLIMIT_NOFILE)
    );
    // systemd sets the limits before anything else, as root.
    let mut wrapper = vec![
        "prlimit",
        &memlock,
        &nofile,
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/usr/bin/python3",
        "-c",
        LAUNCHER,
        &syscalls,
    ];
    wrapper.extend(WRITABLE);
    wrapper.extend([
        "--",
        "setpriv",
        "--inh-caps=-all",
        &bounding,
        "--no-new-privs",
        "--",
    ]);
    let Some(daemon) = Daemon::start_wrapped(&wrapper, &[]) else {
        return;
    };
    let mounts = fs::read_to_string(format!("/proc/{}/mounts", daemon.pid())).unwrap();
    assert!(
        mounts.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"/") && fields.get(3).is_some_and(|o| o.starts_with("ro"))
        }),
        "the daemon's / is read-only:\n{mounts}"
    );
    let allowed = mask_of(&capabilities);
    let status = fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    for field in ["CapBnd", "CapEff", "CapPrm"] {
        let held = status_field(&status, field);
        assert_eq!(
            held & !allowed,
            0,
            "the daemon holds capabilities outside the unit's bounding set ({field}: {held:x}, \
             allowed {allowed:x})"
        );
    }
    assert_eq!(
        status_field(&status, "NoNewPrivs"),
        1,
        "no_new_privs is set"
    );

    // A ptrace guard is in place: the LSM and fmod_ret programs need only bpf(); the
    // fallback's tracepoints need perf_event_open too.
    let programs = daemon.client().status().unwrap().programs;
    assert!(
        programs.iter().any(|p| [
            "leash_ptrace_lsm",
            "leash_ptrace_guard",
            "leash_ptrace_attach"
        ]
        .iter()
        .any(|guard| p.starts_with(guard))),
        "no ptrace guard under the unit's restrictions: {programs:?}\n{}",
        daemon.log()
    );
    // Where the kernel takes the LSM program (the vmtest guests whose active LSMs have bpf),
    // the unit's capabilities are enough for it.
    let lsm_active = fs::read_to_string("/sys/kernel/security/lsm")
        .is_ok_and(|list| list.trim().split(',').any(|lsm| lsm == "bpf"));
    if lsm_active && std::env::var("LEASH_TEST_REQUIRE_KERNEL_GUARD").is_ok_and(|v| v == "1") {
        assert!(
            programs.iter().any(|p| p.starts_with("leash_ptrace_lsm")),
            "the LSM guard under the unit's restrictions: {programs:?}\n{}",
            daemon.log()
        );
    }

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

    // Without ptrace rights over a client, the daemon still tells a client in a container from
    // one in its own pid namespace, and refuses a bare pid from it. (The tree above may still
    // be listed, its kill not yet over: only a new tree would be wrong.)
    let tree_ids = |daemon: &Daemon| -> Vec<_> {
        let trees = daemon.client().list().unwrap();
        trees.iter().map(|tree| tree.tree).collect()
    };
    let before = tree_ids(&daemon);
    let reply = Container::Rootless.register_bare_pid(&daemon, &Cgroup::new("capabilities-pidns"));
    assert_eq!(reply["error"]["code"], "bad_request", "{reply}");
    let after = tree_ids(&daemon);
    assert!(
        after.iter().all(|tree| before.contains(tree)),
        "nothing was registered for the container's bare pid: trees {before:?}, then {after:?}"
    );
}

/// The system calls the unit's `SystemCallFilter=` allows, its groups (`@system-service`)
/// expanded by systemd-analyze. None where the filter cannot be set up and the runner opted
/// out.
fn allowed_system_calls() -> Option<BTreeSet<String>> {
    let entries: Vec<&str> = UNIT
        .lines()
        .filter_map(|line| line.trim().strip_prefix("SystemCallFilter="))
        .flat_map(str::split_whitespace)
        .collect();
    assert!(
        !entries.is_empty() && !entries[0].starts_with('~'),
        "dist/leash.service has no SystemCallFilter= allow list"
    );
    let groups = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .ok()
        .filter(|output| output.status.success());
    let seccomp = Command::new("/usr/bin/python3")
        .args(["-c", "import seccomp"])
        .status()
        .is_ok_and(|status| status.success());
    let Some(groups) = groups.filter(|_| seccomp) else {
        if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
            eprintln!("NOT TESTED: the system call filter (no systemd-analyze or python3-seccomp)");
            return None;
        }
        panic!(
            "the system call filter needs systemd-analyze and Python's seccomp module \
             (Debian/Ubuntu: apt-get install systemd python3-seccomp; cargo xtask test does), \
             or set {SKIP_VAR}=1 to run without it"
        );
    };
    let groups = parse_groups(&String::from_utf8_lossy(&groups.stdout));
    let mut allowed = BTreeSet::new();
    for entry in entries {
        expand(entry, &groups, &mut allowed);
    }
    Some(allowed)
}

/// `systemd-analyze syscall-filter`'s listing: each `@group` with its members (system calls
/// and other groups).
fn parse_groups(listing: &str) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for line in listing.lines() {
        let Some(word) = line.split_whitespace().next() else {
            continue;
        };
        if line.starts_with('@') {
            groups.push((word.to_owned(), Vec::new()));
        } else if !word.starts_with('#')
            && let Some((_, members)) = groups.last_mut()
        {
            members.push(word.to_owned());
        }
    }
    groups
}

fn expand(entry: &str, groups: &[(String, Vec<String>)], into: &mut BTreeSet<String>) {
    if !entry.starts_with('@') {
        into.insert(entry.to_owned());
        return;
    }
    let (_, members) = groups
        .iter()
        .find(|(name, _)| name == entry)
        .unwrap_or_else(|| panic!("systemd-analyze does not know {entry}"));
    for member in members {
        expand(member, groups, into);
    }
}

/// The capabilities the unit's `CapabilityBoundingSet=` lines keep, as setpriv names them
/// (`bpf` for CAP_BPF).
/// The value of the unit's `Limit*=` line `name` (None: infinity).
fn unit_limit(name: &str) -> Option<u64> {
    let value = UNIT
        .lines()
        .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("dist/leash.service has no {name}="));
    match value.trim() {
        "infinity" => None,
        number => Some(number.parse().unwrap_or_else(|_| panic!("{name}={number}"))),
    }
}

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
