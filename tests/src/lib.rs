//! Shared pieces of the integration tests: each test loads the real programs into the real
//! kernel, runs a process tree inside its own cgroup v2 group, and compares what leash tracks
//! with the cgroup, which the kernel keeps exact: the ground truth for "every process of this
//! tree".
//!
//! A test that cannot load BPF fails with the reason. Whoever runs the suite on a machine
//! without BPF may set `LEASH_TEST_SKIP_BPF=1` to skip those tests instead.

use std::{
    collections::BTreeSet,
    fs,
    io::ErrorKind,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use leash::{Capacity, Tracker};
use leash_common::{Pid, TreeId};

pub use leash;

/// The opt-out: set to 1 to skip (not fail) BPF tests where BPF cannot be loaded.
pub const SKIP_BPF_VAR: &str = "LEASH_TEST_SKIP_BPF";
/// The opt-out of the host libraries' suites (a machine without Node.js or the npm registry):
/// `cargo xtask test` then installs nothing for them, and they say they are skipped.
pub const SKIP_HOSTS_VAR: &str = "LEASH_TEST_SKIP_HOSTS";

/// Whether the host libraries' suites are left out on purpose (LEASH_TEST_SKIP_HOSTS=1); says
/// so if they are.
pub fn hosts_skipped(suite: &str) -> bool {
    let skip = std::env::var(SKIP_HOSTS_VAR).is_ok_and(|v| v == "1");
    if skip {
        eprintln!("SKIPPED: {SKIP_HOSTS_VAR}=1: the {suite} tests are left out");
    }
    skip
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
        .to_owned()
}
/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup` on pure cgroup v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones, wherever /proc/self/mountinfo says.
pub fn cgroup2_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_else(|e| panic!("reading /proc/self/mountinfo: {e}"));
        cgroup2_mount(&mountinfo).unwrap_or_else(|| {
            panic!(
                "no cgroup2 file system is mounted (see /proc/self/mountinfo): the tests use \
                 cgroup v2 as ground truth. Mount one: mount -t cgroup2 none /sys/fs/cgroup"
            )
        })
    })
}

/// The mount point of the first cgroup2 file system in a mountinfo text. A line is
/// `ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS`;
/// the mount point escapes spaces and the like as octal (`\040`).
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        if filesystem.split(' ').next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(unescape_octal(mount.split(' ').nth(4)?)))
    })
}

fn unescape_octal(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|digits| u8::from_str_radix(std::str::from_utf8(digits).ok()?, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Loads the programs, or fails the test saying why. Returns None only when the person running
/// the tests opted out with `LEASH_TEST_SKIP_BPF=1`.
pub fn load_tracker(capacity: Capacity) -> Option<Tracker> {
    or_skip(Tracker::load(capacity))
}

/// [`load_tracker`], pinned under `root` (see `Tracker::load_pinned`).
///
/// A test that takes over pins this process held a moment ago may find their lock still held
/// by this very process: a child another test forked in between holds a copy of the locked
/// directory until it executes its program (close-on-exec closes it only then), and the flock
/// lives as long as any copy. That copy goes within moments, so such a refusal is tried again
/// for a while; a lock another process holds is refused at once.
pub fn load_pinned_tracker(root: &Path) -> Option<(Tracker, leash::kernel::Origin)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let loaded = Tracker::load_pinned(Capacity::default(), root);
        let held_by_this_process = loaded.as_ref().err().is_some_and(|e| {
            e.downcast_ref::<leash::kernel::PinsHeld>()
                .and_then(|held| held.holder.as_ref())
                .is_some_and(|holder| holder.pid == std::process::id())
        });
        if !held_by_this_process || Instant::now() >= deadline {
            return or_skip(loaded);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn or_skip<T>(loaded: anyhow::Result<T>) -> Option<T> {
    match loaded {
        Ok(loaded) => Some(loaded),
        Err(e) if std::env::var(SKIP_BPF_VAR).is_ok_and(|v| v == "1") => {
            eprintln!("SKIPPED: BPF is unavailable ({e:#}) and {SKIP_BPF_VAR}=1");
            None
        }
        Err(e) => panic!(
            "BPF is unavailable, so this test cannot run: {e:#}\n\
             Run the tests as root on a kernel with BTF (cargo xtask test), or set \
             {SKIP_BPF_VAR}=1 to skip the BPF tests on purpose."
        ),
    }
}

/// `let Some(mut tracker) = tracker!() else { return };`
#[macro_export]
macro_rules! tracker {
    () => {
        $crate::load_tracker($crate::leash::Capacity::default())
    };
    ($capacity:expr) => {
        $crate::load_tracker($capacity)
    };
}

/// A cgroup v2 group of the test's own. Dropping it kills what is left in it and removes it,
/// with any groups made below it.
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    pub fn new(label: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let root = cgroup2_root();
        let name = format!(
            "leash-test-{}-{label}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = root.join(name);
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        Self { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The processes in the group now (cgroup.procs: thread group ids).
    pub fn procs(&self) -> BTreeSet<Pid> {
        read_pids(&self.procs_file())
    }

    /// Every process with a thread in the group: cgroup.procs, and those some kernels leave
    /// out of it, whose main thread has exited while others run (cgroup.threads names them).
    pub fn processes(&self) -> BTreeSet<Pid> {
        let threads = read_pids(&self.path.join("cgroup.threads"));
        let mut processes = self.procs();
        processes.extend(threads.into_iter().filter_map(leash::proc::thread_group_of));
        processes
    }

    /// Whether any thread is left in the group (cgroup.events; a dying main thread counts).
    pub fn populated(&self) -> bool {
        fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| !events.contains("populated 0"))
            .unwrap_or(false)
    }

    /// A file for the output of what runs in the group when the test does not read it (a
    /// shell's `Killed` or `Terminated` for a job the test's kill ended): shown when the test
    /// fails, not among the lines of the tests that pass; removed with the group.
    pub fn output_log(&self) -> fs::File {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.output_path())
            .expect("opening the group's output log")
    }

    fn output_path(&self) -> PathBuf {
        let name = self.path.file_name().expect("a group's name");
        std::env::temp_dir().join(format!("{}.output", name.to_string_lossy()))
    }

    /// A command that moves itself into this group, then execs `program args...`. Nothing of
    /// `program` runs outside the group.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        command
            .args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.procs_file())
            .arg(program)
            .args(args)
            .stdin(Stdio::null());
        command
    }

    /// Waits for the group to settle: exactly `count` processes, each running a program whose
    /// name starts with one of `final_comms`. Returns the processes.
    pub fn settle(&self, count: usize, final_comms: &[&str]) -> BTreeSet<Pid> {
        let mut last = BTreeSet::new();
        let settled = wait_for(Duration::from_secs(60), || {
            last = self.procs();
            last.len() == count
                && last.iter().all(|&pid| {
                    comm(pid).is_some_and(|c| final_comms.iter().any(|f| c.starts_with(f)))
                })
        });
        assert!(
            settled,
            "cgroup {} did not settle at {count} processes of {final_comms:?}: it has {} ({:?})",
            self.path.display(),
            last.len(),
            last.iter()
                .take(20)
                .map(|&p| (p, comm(p)))
                .collect::<Vec<_>>()
        );
        last
    }

    /// Waits until the group holds exactly one process per entry of `comms`, each running a
    /// program whose name starts with its entry. Returns the processes.
    pub fn settle_exactly(&self, comms: &[&str]) -> BTreeSet<Pid> {
        let mut last = Vec::new();
        let settled = wait_for(Duration::from_secs(60), || {
            last = self
                .procs()
                .into_iter()
                .map(|pid| comm(pid).unwrap_or_default())
                .collect();
            let mut unmatched = last.clone();
            comms.iter().all(|want| {
                let found = unmatched.iter().position(|c| c.starts_with(want));
                found.map(|i| unmatched.swap_remove(i)).is_some()
            }) && unmatched.is_empty()
        });
        assert!(
            settled,
            "cgroup {} did not settle as {comms:?}: it has {last:?}",
            self.path.display()
        );
        self.procs()
    }

    /// Kills every process in the group (and the groups below) and waits for it to empty.
    pub fn kill_all(&self) {
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        // cgroup.kill signals the processes cgroup.procs lists, which leaves out a process
        // whose main thread has exited while others run: signal every thread too.
        let threads = read_pids(&self.path.join("cgroup.threads"));
        if !threads.is_empty() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(threads.iter().map(|tid| tid.to_string()))
                .stderr(Stdio::null())
                .status();
        }
        wait_for(Duration::from_secs(10), || !self.populated());
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // cgroup.kill kills the groups below too.
        self.kill_all();
        let mut groups = Vec::new();
        groups_below(&self.path, &mut groups);
        groups.push(self.path.clone());
        for group in groups {
            if let Err(e) = fs::remove_dir(&group)
                && e.kind() != ErrorKind::NotFound
            {
                eprintln!("could not remove {}: {e}", group.display());
            }
        }
        let log = self.output_path();
        if thread::panicking() {
            let said = fs::read_to_string(&log).unwrap_or_default();
            if !said.is_empty() {
                eprintln!("the output of what ran in {}:\n{said}", self.path.display());
            }
        }
        let _ = fs::remove_file(log);
    }
}

/// The groups below `dir`, deepest first.
fn groups_below(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            groups_below(&entry.path(), out);
            out.push(entry.path());
        }
    }
}

/// A tree started under a tracker inside its own cgroup. Dropping it kills the whole group and
/// reaps the root.
pub struct Scenario {
    pub tree: TreeId,
    pub root: Child,
    // Declared last: dropped after the root is reaped below.
    pub cgroup: Cgroup,
}

impl Scenario {
    /// Starts `program args...` as the root of a new tree (held until registered), inside a
    /// new cgroup, its output to the group's [`Cgroup::output_log`].
    pub fn spawn(tracker: &mut Tracker, label: &str, program: &str, args: &[&str]) -> Self {
        let cgroup = Cgroup::new(label);
        let mut command = cgroup.command(program, args);
        command
            .stdout(cgroup.output_log())
            .stderr(cgroup.output_log());
        Self::spawn_command(tracker, cgroup, command)
    }

    /// Starts `command` (made with [`Cgroup::command`] of `cgroup`) as the root of a new tree.
    pub fn spawn_command(tracker: &mut Tracker, cgroup: Cgroup, mut command: Command) -> Self {
        let (tree, root) = tracker.spawn(&mut command).expect("spawning the scenario");
        Self { tree, root, cgroup }
    }

    pub fn root_pid(&self) -> Pid {
        self.root.id()
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        self.cgroup.kill_all();
        let _ = self.root.kill();
        let _ = self.root.wait();
    }
}

/// The pids leash tracks in `tree` now.
pub fn tracked(tracker: &Tracker, tree: TreeId) -> BTreeSet<Pid> {
    tracker
        .members(tree)
        .expect("listing members")
        .into_iter()
        .map(|m| m.pid)
        .collect()
}

/// Asserts that leash tracks exactly the cgroup's processes, and that the kernel's member
/// count agrees. Prints the figures for the record. Returns the number of processes.
pub fn assert_tracks_cgroup(
    tracker: &Tracker,
    tree: TreeId,
    cgroup: &Cgroup,
    scenario: &str,
) -> usize {
    let truth = cgroup.processes();
    let (mut members, mut count) = (BTreeSet::new(), 0);
    // Members are added at fork and removed at exit synchronously; a short wait only covers
    // exits still in flight when the cgroup was read.
    let equal = wait_for(Duration::from_secs(5), || {
        members = tracked(tracker, tree);
        count = tracker.tree_status(tree).expect("tree status").members;
        members == cgroup.processes() && count == members.len() as u64
    });
    let status = tracker.tree_status(tree).expect("tree status");
    eprintln!(
        "scenario {scenario}: tracked {} / ground truth {} (kernel count {count}, failed inserts {})",
        members.len(),
        truth.len(),
        status.failed_inserts
    );
    assert!(
        equal,
        "{scenario}: tracked set != cgroup set\n  only tracked: {:?}\n  only in cgroup: {:?}\n  kernel count: {count}",
        members.difference(&truth).collect::<Vec<_>>(),
        truth
            .difference(&members)
            .map(|&p| (p, comm(p)))
            .collect::<Vec<_>>(),
    );
    // A thread that was taken for a process would show here (its insert fails on the key).
    assert_eq!(
        status.failed_inserts, 0,
        "{scenario}: no insert may fail below capacity"
    );
    members.len()
}

/// A path of the test's own (a directory with all in it, such as a pin root, or a file), removed
/// however the test ends.
pub struct Removed(pub PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0).or_else(|_| fs::remove_file(&self.0));
    }
}

/// Polls `condition` every few milliseconds until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

pub fn comm(pid: Pid) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim_end().to_owned())
}

pub fn ppid(pid: Pid) -> Option<Pid> {
    leash::proc::process(pid).map(|p| p.ppid)
}

/// Threads of a process now.
pub fn thread_count(pid: Pid) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

fn read_pids(path: &Path) -> BTreeSet<Pid> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A shell script for `sh -c SCRIPT SCRIPT N`: a chain N forks deep; each hop starts the next
/// in the background (through `$LEASH_HOP`, e.g. "setsid", when set) and then becomes `sleep`.
/// N+1 processes.
pub const CHAIN: &str =
    r#"n=$1; if [ "$n" -gt 0 ]; then $LEASH_HOP sh -c "$0" "$0" $((n-1)) & fi; exec sleep 600"#;

/// A new cgroup and a command that runs a [`CHAIN`] `depth` hops deep inside it, each hop
/// started through `hop` (e.g. `setsid`) when given.
pub fn chain_command(label: &str, depth: usize, hop: Option<&str>) -> (Cgroup, Command) {
    let cgroup = Cgroup::new(label);
    let depth = depth.to_string();
    let mut command = cgroup.command("sh", &["-c", CHAIN, CHAIN, &depth]);
    command.env("LEASH_HOP", hop.unwrap_or(""));
    (cgroup, command)
}

/// The `leash` binary of the same build as the running program: next to it (a binary in
/// target/PROFILE) or one level up (a test in target/PROFILE/deps). `cargo xtask test` builds
/// it before the tests run.
pub fn leash_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the program's own path");
    let dir = exe.parent().expect("a directory");
    [dir, dir.parent().unwrap_or(dir)]
        .iter()
        .map(|d| d.join("leash"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no leash binary next to {}: run `cargo build` first (cargo xtask test does)",
                exe.display()
            )
        })
}

impl Cgroup {
    /// The argv of [`Cgroup::command`]: for commands that other programs start.
    pub fn argv(&self, program: &str, args: &[&str]) -> Vec<String> {
        let command = self.command(program, args);
        std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Waits until no process is left in the group; returns how long that took, to about a
    /// millisecond (it is a measurement as well as a wait).
    pub fn wait_empty(&self, timeout: Duration) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            if self.procs().is_empty() {
                return Some(started.elapsed());
            }
            thread::sleep(Duration::from_millis(1));
        }
        None
    }
}

/// How many descriptors process `pid` has open now (0 if it is gone).
pub fn open_descriptors(pid: u32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| dir.count() as u64)
}

pub mod container;
pub mod daemon;
pub mod script;
pub mod tmux;
pub mod victim;

/// The real Python interpreter. `python3` on PATH may be a pyenv shim that forks dozens of
/// short-lived helpers before it execs the interpreter, which would make a tree's size race.
pub fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let output = Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 is needed by the tests");
            String::from_utf8(output.stdout)
                .expect("utf-8")
                .trim()
                .to_owned()
        })
        .clone()
}

/// The lines of `child`'s stdout (piped), as they come, read by a thread of their own: a test
/// waits for the line it needs with a deadline (`recv_timeout`), never for the child to end.
pub fn read_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::{BufRead, BufReader};
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// CAP_SYS_RESOURCE's number (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// `limit` as prlimit takes it, or the hard limit now where raising it past that needs
/// CAP_SYS_RESOURCE and the test runs without it (some sandboxes; systemd has it).
pub fn settable_limit(limit: Option<u64>, resource: libc::__rlimit_resource_t) -> String {
    let mut now = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid resource and a valid pointer to an rlimit.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut now) }, 0);
    let hard = (now.rlim_max != libc::RLIM_INFINITY).then_some(now.rlim_max);
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let may_raise = status_field(&status, "CapEff") & (1 << CAP_SYS_RESOURCE) != 0;
    let settable = match (limit, hard) {
        (_, None) => limit,
        (Some(limit), Some(hard)) if limit <= hard => Some(limit),
        _ if may_raise => limit,
        (_, Some(hard)) => {
            eprintln!(
                "NOT TESTED: a resource limit of {limit:?} (without CAP_SYS_RESOURCE here: {hard})"
            );
            Some(hard)
        }
    };
    settable.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

/// A number field of /proc/PID/status: capability sets are hexadecimal, the rest decimal.
pub fn status_field(status: &str, field: &str) -> u64 {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"))
        .trim();
    let radix = if field.starts_with("Cap") { 16 } else { 10 };
    u64::from_str_radix(value, radix).unwrap()
}

/// `name` as a file in one of PATH's directories.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Where `cargo xtask test` installs the npm packages of the hosts' tests (the Claude Agent
/// SDK, TypeScript, Bun): LEASH_HOSTS_CACHE, or /var/cache/leash-hosts.
pub fn hosts_cache() -> PathBuf {
    std::env::var_os("LEASH_HOSTS_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/leash-hosts"), PathBuf::from)
}

/// Copies a file, or a directory without its node_modules and __pycache__, where every user
/// may read it (and run what was executable), for hosts that run unprivileged.
pub fn copy_readable(from: &Path, to: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    let meta = fs::metadata(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if meta.is_file() {
        fs::copy(from, to).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        let mode = if meta.permissions().mode() & 0o111 != 0 {
            0o755
        } else {
            0o644
        };
        fs::set_permissions(to, fs::Permissions::from_mode(mode)).unwrap();
        return;
    }
    fs::create_dir_all(to).unwrap();
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let name = entry.unwrap().file_name();
        if name != "node_modules" && name != "__pycache__" {
            copy_readable(&from.join(&name), &to.join(&name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_on_hybrid_and_pure_hosts() {
        let hybrid = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
34 25 0:29 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
35 34 0:30 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 34 0:31 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,name=systemd
";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "35 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let escaped = "35 25 0:30 / /mnt/my\\040groups rw - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_mount(escaped),
            Some(PathBuf::from("/mnt/my groups"))
        );
        assert_eq!(
            cgroup2_mount("36 34 0:31 / /x rw - cgroup cgroup rw\n"),
            None
        );
    }
}
