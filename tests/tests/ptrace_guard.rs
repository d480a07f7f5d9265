//! The agent cannot reach outside its tree, even as its host's uid. As uid 61001, a host
//! (`leash run`) runs an agent that tries, against the host itself: a ptrace attach, taking the
//! host's lease socket with `pidfd_getfd`, `process_vm_writev`, and opening /proc/HOST/mem; and a
//! real `process_vm_writev` into another process of its uid outside every tree. Each is refused
//! in the kernel (a BPF LSM program on `ptrace_access_check` where the BPF LSM is active, else
//! fmod_ret on `security_ptrace_access_check`), nothing is written, and it stays
//! refused while the daemon is dead (the link is pinned) and after a takeover. What must keep
//! working does: reading /proc/HOST/stat (`ps`), attaching to its own child, gdb on its own
//! child; and a process of the same uid outside every tree may still do all of it to the host.
//!
//! fmod_ret where the LSM program would do (`--ptrace-guard fmod_ret`), the kprobe for kernels
//! without BPF trampolines (`--ptrace-guard kprobe`), and the last fallback, for kernels
//! without kprobes either (`--ptrace-guard tracepoints`), are run here too: with the kprobe the
//! agent is SIGKILLed as it asks; with the tracepoints too, and /proc/PID/mem is not covered.
//! On 7.x without the BPF LSM the kprobe stands beside fmod_ret, acting only where the kernel
//! skipped fmod_ret, and the default test checks it is there. Where the
//! kernel refuses both programs (this project's 6.18 build machines), the tests check the
//! fallback the daemon chose, and say so; the vmtest guests set
//! LEASH_TEST_REQUIRE_KERNEL_GUARD=1.
//!
//! gdb is not in the vmtest guests: they set LEASH_TEST_NO_GDB=1, and the gdb check is skipped
//! there (and only where that is set).

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use leash_tests::{
    Cgroup, Removed,
    daemon::{Daemon, USER_A, path_str, setpriv_args},
    wait_for,
};

/// The agent: argv is PROBE OUT GDB TARGET_PID TARGET_ADDR. Its parent is the host (`leash run`);
/// the target, a process of its uid outside every tree, holds a buffer at TARGET_ADDR. It writes
/// `NAME RESULT` lines to OUT; then, each time OUT.again appears, it removes it and tries the
/// attach again, into OUT.1, OUT.2...
const AGENT: &str = r#"
probe=$1 out=$2 gdb=$3 target=$4 target_addr=$5 host=$PPID
say() { echo "$1 $2" >> "$out.part"; }
try() {
    name=$1; shift
    result=$("$probe" "$@" 2>&1); status=$?
    if [ $status -eq 137 ]; then result=killed; elif [ $status -ne 0 ]; then result="exit $status: $result"; fi
    say "$name" "$result"
}
say host_comm "$(cat /proc/$host/comm)"
sock=none
for f in /proc/$host/fd/*; do
    case "$(readlink "$f")" in socket:*) sock=${f##*/}; break;; esac
done
say host_socket_fd "$sock"
try attach_host attach $host
try getfd_host getfd $host $sock
try vmwrite_host vmwrite $host
try memopen_host memopen $host
try vmwrite_target vmwrite $target $target_addr
if read -r line < /proc/$host/stat; then say stat_host ok; else say stat_host refused; fi
sleep 600 & child=$!
try attach_child attach $child
try vmwrite_child vmwrite $child
if [ "$gdb" = 1 ]; then
    export DEBUGINFOD_URLS=
    if gdb -batch -nx -p $child -ex detach > "$out.gdb" 2>&1; then say gdb_child ok; else say gdb_child failed; fi
    gdb -batch -nx -p $host -ex detach > "$out.gdbhost" 2>&1; status=$?
    if [ $status -eq 137 ]; then say gdb_host killed
    elif grep -q "Operation not permitted" "$out.gdbhost"; then say gdb_host refused
    else say gdb_host attached; fi
fi
kill $child
mv "$out.part" "$out"
base=$out n=0
while :; do
    while [ ! -e "$base.again" ]; do sleep 0.05; done
    rm -f "$base.again"
    n=$((n + 1)) out=$base.$n
    try attach_host attach $host
    mv "$out.part" "$out"
done
"#;

/// process_vm_writev to address 1 once the access check has passed.
const PASSED_CHECK: &str = "errno 14";
/// Set to 1 where a guard in the kernel's check must be the one in place (the vmtest guests:
/// Debian's kernels, which have BPF trampolines): the LSM program where the BPF LSM is active,
/// else fmod_ret. Elsewhere the tests check whichever guard the daemon reports, and say which.
const REQUIRE_KERNEL_GUARD_VAR: &str = "LEASH_TEST_REQUIRE_KERNEL_GUARD";

/// Whether this machine's active LSMs, as securityfs lists them, have the BPF LSM; None if the
/// list cannot be read.
fn bpf_lsm_active() -> Option<bool> {
    let list = fs::read_to_string("/sys/kernel/security/lsm").ok()?;
    Some(list.trim().split(',').any(|lsm| lsm == "bpf"))
}

/// Whether the guard `wanted` must be in place here (the vmtest guests), or only checked.
fn required() -> bool {
    std::env::var(REQUIRE_KERNEL_GUARD_VAR).is_ok_and(|v| v == "1")
}

/// The guard a daemon reports in `leash status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guard {
    /// The LSM program: the access fails with EPERM (EACCES for /proc/PID/mem).
    Lsm,
    /// fmod_ret: the same.
    FmodRet,
    /// The kprobe where fmod_ret cannot attach: the member asking is SIGKILLed, whatever it
    /// asks (/proc/PID/mem included).
    Kprobe,
    /// The fallback: the member asking is SIGKILLed; /proc/PID/mem is not covered.
    Tracepoints,
}

impl Guard {
    fn reported(daemon: &Daemon) -> Self {
        let status = status_text(daemon);
        if status.contains("leash_ptrace_lsm (lsm/ptrace_access_check)") {
            Self::Lsm
        } else if status.contains("leash_ptrace_guard (fmod_ret/security_ptrace_access_check)") {
            Self::FmodRet
        } else if status.contains("leash_ptrace_kp (kprobe/cap_ptrace_access_check)") {
            Self::Kprobe
        } else if status.contains("leash_ptrace_attach (tracepoint/syscalls/sys_enter_ptrace)")
            && status.contains("leash_pidfd_getfd")
            && status.contains("leash_vm_writev")
        {
            Self::Tracepoints
        } else {
            panic!(
                "no ptrace guard in place: {status}\ndaemon log:\n{}",
                daemon.log()
            )
        }
    }

    /// Whether `result` (of the probe) is this guard's refusal.
    fn refused(self, result: &str) -> bool {
        match self {
            Self::Lsm | Self::FmodRet => result == "errno 1" || result == "errno 13",
            Self::Kprobe | Self::Tracepoints => result == "killed",
        }
    }
}

struct Run {
    results: BTreeMap<String, String>,
    agent: Cgroup,
    host: Child,
    target: Target,
    out: Removed,
    probe: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        // The host and the whole tree, whatever happened.
        self.agent.kill_all();
        let _ = self.host.kill();
        let _ = self.host.wait();
    }
}

/// A process of the agent's uid outside every tree, with a buffer the agent tries to write.
struct Target {
    process: Child,
    address: u64,
    // Dropped last: kills the target whatever happened.
    _cgroup: Cgroup,
}

impl Target {
    fn start(probe: &Path) -> Self {
        let cgroup = Cgroup::new("outside-target");
        let mut argv = setpriv_args(USER_A);
        argv.extend([path_str(probe).to_owned(), "hold".to_owned()]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut process = cgroup
            .command("setpriv", &argv)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(process.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let address = line
            .split_whitespace()
            .nth(1)
            .and_then(|a| u64::from_str_radix(a, 16).ok())
            .unwrap_or_else(|| panic!("the target said {line:?}"));
        Self {
            process,
            address,
            _cgroup: cgroup,
        }
    }

    /// The buffer now, read through /proc/PID/mem (as root).
    fn buffer(&self) -> Vec<u8> {
        use std::os::unix::fs::FileExt;
        let mem = fs::File::open(format!("/proc/{}/mem", self.process.id())).unwrap();
        let mut buffer = vec![0; 8];
        mem.read_exact_at(&mut buffer, self.address).unwrap();
        buffer
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Run {
    fn get(&self, name: &str) -> &str {
        self.results.get(name).map_or("(not tried)", String::as_str)
    }

    /// Runs the probe as the host's uid from outside every tree.
    fn probe_from_outside(&self, args: &[&str]) -> String {
        let outside = Cgroup::new("outside");
        let mut argv = setpriv_args(USER_A);
        argv.push(path_str(&self.probe).to_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let output = outside.command("setpriv", &argv).output().unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Lets the agent try the attach again, for the `round`th time (from 1); returns what it
    /// got.
    fn attach_again(&self, round: usize) -> String {
        let again = PathBuf::from(format!("{}.again", self.out.0.display()));
        fs::write(&again, "").unwrap();
        let second = PathBuf::from(format!("{}.{round}", self.out.0.display()));
        assert!(
            wait_for(Duration::from_secs(30), || second.exists()),
            "the agent did not try again; its processes: {:?}; its directory: {:?}",
            self.agent
                .procs()
                .iter()
                .map(|&pid| (pid, leash_tests::comm(pid)))
                .collect::<Vec<_>>(),
            fs::read_dir(second.parent().unwrap())
                .map(|entries| entries.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
        let results = read_results(&second);
        let _ = fs::remove_file(&second);
        results.get("attach_host").cloned().unwrap_or_default()
    }
}

fn gdb_wanted() -> bool {
    if std::env::var("LEASH_TEST_NO_GDB").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: the gdb checks (LEASH_TEST_NO_GDB=1: this machine has no gdb)");
        return false;
    }
    true
}

fn read_results(path: &Path) -> BTreeMap<String, String> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(name, result)| (name.to_owned(), result.to_owned()))
        .collect()
}

/// The probe where uid 61001 may run it (the build tree may not be reachable).
fn probe_for_anyone(daemon: &Daemon) -> PathBuf {
    let probe = daemon.dir.join("ptrace-probe");
    if !probe.exists() && fs::hard_link(env!("CARGO_BIN_EXE_ptrace-probe"), &probe).is_err() {
        fs::copy(env!("CARGO_BIN_EXE_ptrace-probe"), &probe).unwrap();
        fs::set_permissions(&probe, fs::Permissions::from_mode(0o755)).unwrap();
    }
    probe
}

/// Starts the host and its agent as uid 61001 and waits for the agent's first report.
fn run_agent(daemon: &Daemon, gdb: bool) -> Run {
    // The agent reports there: a directory of its own, since the daemon's must stay root's
    // alone for the restart.
    let reports = daemon.dir.join("agent");
    fs::create_dir_all(&reports).unwrap();
    fs::set_permissions(&reports, fs::Permissions::from_mode(0o777)).unwrap();
    let out = Removed(reports.join("results"));
    let probe = probe_for_anyone(daemon);
    let target = Target::start(&probe);
    let target_pid = target.process.id().to_string();
    let target_address = format!("{:x}", target.address);
    let agent = Cgroup::new("ptrace-agent");
    let gdb_arg = if gdb { "1" } else { "0" };
    let mut host = daemon
        .leash_as(
            USER_A,
            &agent,
            &[
                "run",
                "--",
                "sh",
                "-c",
                AGENT,
                "agent",
                path_str(&probe),
                path_str(&out.0),
                gdb_arg,
                &target_pid,
                &target_address,
            ],
        )
        .spawn()
        .unwrap();
    let reported = wait_for(Duration::from_secs(60), || out.0.exists());
    if !reported {
        let _ = host.kill();
        let _ = host.wait();
        panic!("the agent did not report; daemon log:\n{}", daemon.log());
    }
    let results = read_results(&out.0);
    eprintln!("what the agent got: {results:#?}");
    Run {
        results,
        agent,
        host,
        target,
        out,
        probe,
    }
}

fn status_text(daemon: &Daemon) -> String {
    let output = Command::new(leash_tests::leash_binary())
        .arg("--socket")
        .arg(&daemon.socket)
        .arg("status")
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn assert_outside_still_may(run: &Run) {
    // The host is the process the cgroup started with: `leash run`.
    let host = run.host.id().to_string();
    let socket_fd = run.get("host_socket_fd").to_owned();
    assert_eq!(
        run.probe_from_outside(&["attach", &host]),
        "ok",
        "a process outside every tree may still attach to the host"
    );
    assert_eq!(
        run.probe_from_outside(&["getfd", &host, &socket_fd]),
        "ok",
        "a process outside every tree may still take the host's descriptor"
    );
    assert_eq!(
        run.probe_from_outside(&["vmwrite", &host]),
        PASSED_CHECK,
        "a process outside every tree passes the access check for process_vm_writev"
    );
}

/// The agent's process_vm_writev into the target was refused, and wrote nothing.
fn assert_target_untouched(guard: Guard, run: &Run) {
    assert_refused(guard, run, &["vmwrite_target"]);
    assert_eq!(
        run.target.buffer(),
        b"UNTOUCH\0",
        "the target's memory is as it was"
    );
}

fn assert_inside_keeps_working(run: &Run) {
    assert_eq!(
        run.get("host_comm"),
        "leash",
        "the agent's parent is its host"
    );
    assert_ne!(
        run.get("host_socket_fd"),
        "none",
        "the host holds its lease socket"
    );
    assert_eq!(
        run.get("stat_host"),
        "ok",
        "read mode (ps) is never refused"
    );
    assert_eq!(
        run.get("attach_child"),
        "ok",
        "attaching within the tree works"
    );
    assert_eq!(
        run.get("vmwrite_child"),
        PASSED_CHECK,
        "process_vm_writev within the tree passes the access check"
    );
}

fn assert_refused(guard: Guard, run: &Run, names: &[&str]) {
    for name in names {
        assert!(
            guard.refused(run.get(name)),
            "{name}: the host is outside the agent's tree, so {guard:?} refuses this; it got {}",
            run.get(name)
        );
    }
}

#[test]
fn a_member_cannot_ptrace_take_descriptors_or_write_memory_outside_its_tree() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let guard = Guard::reported(&daemon);
    // Where the BPF LSM is active the LSM program, which the kernel never skips; else fmod_ret.
    let kernel_guard = if bpf_lsm_active() == Some(true) {
        Guard::Lsm
    } else {
        Guard::FmodRet
    };
    check_guard(&daemon, guard, kernel_guard);
    if guard == Guard::FmodRet && required() && kernel_at_least_7() {
        // fmod_ret may be skipped here: the kprobe stands beside it.
        assert!(
            status_text(&daemon).contains("leash_ptrace_kp (kprobe/cap_ptrace_access_check)"),
            "on 7.x the kprobe is beside fmod_ret: {}",
            status_text(&daemon)
        );
    }
    let gdb = gdb_wanted();
    let run = run_agent(&daemon, gdb);

    assert_refused(guard, &run, &["attach_host", "getfd_host", "vmwrite_host"]);
    assert_target_untouched(guard, &run);
    if guard != Guard::Tracepoints {
        assert_refused(guard, &run, &["memopen_host"]);
    }
    assert_inside_keeps_working(&run);
    if gdb {
        assert_eq!(
            run.get("gdb_child"),
            "ok",
            "gdb on a child within the tree works: {}",
            fs::read_to_string(format!("{}.gdb", run.out.0.display())).unwrap_or_default()
        );
        let expected = match guard {
            Guard::Lsm | Guard::FmodRet => "refused",
            Guard::Kprobe | Guard::Tracepoints => "killed",
        };
        assert_eq!(run.get("gdb_host"), expected, "gdb on the host");
    }
    assert_outside_still_may(&run);

    // The daemon dies: its pinned links go on refusing.
    daemon.kill_hard();
    assert!(
        guard.refused(&run.attach_again(1)),
        "the guard holds while the daemon is away"
    );
    // The next daemon takes the pinned guard over, and says so.
    daemon.restart();
    assert_eq!(
        Guard::reported(&daemon),
        guard,
        "the guard taken over is reported"
    );
    assert!(
        guard.refused(&run.attach_again(2)),
        "the guard holds after a takeover"
    );
}

/// Fails unless `guard` is `wanted` where [`REQUIRE_KERNEL_GUARD_VAR`] asks for it; elsewhere
/// says which guard this run checks when it is the fallback.
fn check_guard(daemon: &Daemon, guard: Guard, wanted: Guard) {
    if required() {
        assert_eq!(
            guard,
            wanted,
            "{REQUIRE_KERNEL_GUARD_VAR}=1, and the active LSMs are {:?}; daemon log:\n{}",
            fs::read_to_string("/sys/kernel/security/lsm").unwrap_or_default(),
            daemon.log()
        );
    } else if guard != wanted {
        eprintln!(
            "NOTE: this kernel refused the {wanted:?} guard, and the daemon attached {guard:?}; \
             this run checks that one. Its log:\n{}",
            daemon.log()
        );
    }
}

#[test]
fn fmod_ret_refuses_where_the_lsm_program_would_do() {
    guard_chosen_holds("fmod_ret", Guard::FmodRet);
}

#[test]
fn the_kprobe_kills_a_member_that_reaches_outside_its_tree_even_through_proc_mem() {
    guard_chosen_holds("kprobe", Guard::Kprobe);
}

/// A daemon started with `--ptrace-guard CHOICE` has the guard `wanted` (where it must), and
/// that guard refuses what reaches outside the tree (/proc/PID/mem too, but for the syscall
/// tracepoints) and nothing inside it.
fn guard_chosen_holds(choice: &str, wanted: Guard) {
    let Some(daemon) = Daemon::start(&["--ptrace-guard", choice]) else {
        return;
    };
    let guard = Guard::reported(&daemon);
    check_guard(&daemon, guard, wanted);
    let run = run_agent(&daemon, false);
    assert_refused(guard, &run, &["attach_host", "getfd_host", "vmwrite_host"]);
    if guard != Guard::Tracepoints {
        assert_refused(guard, &run, &["memopen_host"]);
    }
    assert_target_untouched(guard, &run);
    assert_inside_keeps_working(&run);
    assert_outside_still_may(&run);
}

/// Whether this kernel is 7.0 or later (7.3-rc included), from its release string.
fn kernel_at_least_7() -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|major| major >= 7)
}

#[test]
fn the_fallback_kills_a_member_that_reaches_outside_its_tree() {
    let Some(daemon) = Daemon::start(&["--ptrace-guard", "tracepoints"]) else {
        return;
    };
    assert_eq!(Guard::reported(&daemon), Guard::Tracepoints);
    let run = run_agent(&daemon, false);
    assert_refused(
        Guard::Tracepoints,
        &run,
        &["attach_host", "getfd_host", "vmwrite_host"],
    );
    assert_target_untouched(Guard::Tracepoints, &run);
    // Documented: the fallback does not see /proc/PID/mem.
    eprintln!(
        "memopen_host under the fallback (not covered): {}",
        run.get("memopen_host")
    );
    assert_inside_keeps_working(&run);
    assert_outside_still_may(&run);
}
