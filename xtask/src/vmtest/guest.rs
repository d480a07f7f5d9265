//! What the guest runs as PID 1: a busybox shell script that sets the machine up as a modern
//! distribution has it (pure cgroup v2 at /sys/fs/cgroup, bpffs, /tmp and /run on tmpfs, lo up),
//! runs each scenario with its output straight on the serial console, and powers off. Marker
//! lines tell the host what is happening; nothing else in the output starts with [`MARKER`].

use std::path::Path;

use super::initramfs::{BUSYBOX_DIR, Held, HeldKind};

/// The start of every line the host reads as a report from init.
pub(super) const MARKER: &str = "@@vmtest";
/// On the kernel's command line of a guest whose kernel has no BPF trampolines, so that it
/// attaches neither of the ptrace guards in the kernel's check (the LSM and fmod_ret programs):
/// its `ptrace_guard` then checks the fallback the daemon chose.
pub(super) const NO_TRAMPOLINES: &str = "leash_vmtest.no_trampolines";
/// On the kernel's command line, `RUN=3,17`: init runs only the scenarios at those places of
/// the image's list, counted from 0 (a guest booted again after an oops goes on where the last
/// one stopped; the newest kernel's failures run again). Absent, init runs them all.
pub(super) const RUN: &str = "leash_vmtest.run";
/// How long one scenario may run in a guest before it is killed (the host's own timeout, for
/// the whole kernel, is the backstop).
pub(super) const SCENARIO_TIMEOUT_S: u64 = 600;

/// The directories init mounts a tmpfs on, as a distribution has them. What the image holds in
/// them (a checkout under /tmp: the test binaries, at the paths compiled into them) would be
/// hidden: init binds the image's directory to [`IMAGE_DIR`] first, and each thing it held back
/// over the tmpfs.
pub(super) const TMPFS_DIRS: [&str; 2] = ["/tmp", "/run"];
/// What `image` holds directly in [`TMPFS_DIRS`], which init puts back over its tmpfs mounts.
pub(super) fn held(image: &super::initramfs::Image) -> Vec<super::initramfs::Held> {
    TMPFS_DIRS
        .iter()
        .flat_map(|dir| image.held_in(std::path::Path::new(dir)))
        .collect()
}

/// Where init keeps the image's own [`TMPFS_DIRS`] reachable.
const IMAGE_DIR: &str = "/vmtest/image";

/// A scenario as the guest runs it: the test binary with exactly these tests.
pub(super) struct GuestTest<'a> {
    pub name: &'a str,
    /// Full names, passed with `--exact`.
    pub tests: &'a [String],
}

/// The init script. Its markers, one per line:
/// - `@@vmtest kernel RELEASE` once set up;
/// - `@@vmtest begin NAME` and `@@vmtest end NAME STATUS` around each scenario, one run of
///   `binary` each;
/// - `@@vmtest done` before powering off.
///
/// With [`RUN`]`=...` on the kernel's command line, only the scenarios it names run; the others
/// are skipped, markers and all.
pub(super) fn init_script(
    binary: &Path,
    tests: &[GuestTest],
    test_args: &[String],
    workdir: &Path,
    held: &[Held],
) -> String {
    let mut script = setup_script("leash's integration tests", workdir, held);
    let args: String = test_args.iter().map(|a| format!(" {}", quote(a))).collect();
    // The kernel names a process after the first 15 bytes of its file's name.
    let file_name = binary.file_name().unwrap_or_default().to_string_lossy();
    let comm: String = file_name.chars().take(15).collect();
    let path = quote(&binary.to_string_lossy());
    script.push_str(&format!(
        "run=$(sed -n 's/.*{RUN}=\\([0-9,]*\\).*/\\1/p' /proc/cmdline)\n"
    ));
    for (index, test) in tests.iter().enumerate() {
        let names: String = test
            .tests
            .iter()
            .map(|t| format!(" {}", quote(t)))
            .collect();
        script.push_str(&format!(
            "case \",${{run:-all}},\" in ,all,|*,{index},*)\n\
             echo > $T/trace 2>/dev/null\n\
             echo \"{MARKER} begin {name}\"\n\
             timeout -s KILL {SCENARIO_TIMEOUT_S} {path} --exact{names}{args} </dev/null 2>&1\n\
             status=$?\n\
             [ $status = 137 ] && grep -F ' comm={comm} ' $T/trace 2>/dev/null | tail -3 | sed 's/^/SIGKILL by /'\n\
             echo \"{MARKER} end {name} $status\"\n\
             ;; esac\n",
            name = test.name,
        ));
    }
    script.push_str(&format!("echo \"{MARKER} done\"\npoweroff -f\n"));
    script
}

/// The start of an init script: `what` it is for in its comment, the machine set up as a
/// distribution has it (with what the image holds in [`TMPFS_DIRS`], `held`, put back), `@@vmtest
/// kernel RELEASE` said, and `workdir` the working directory.
pub(super) fn setup_script(what: &str, workdir: &Path, held: &[Held]) -> String {
    format!(
        r#"#!{BUSYBOX_DIR}/busybox sh
# {what} in a virtual machine (cargo xtask vmtest).
{BUSYBOX_DIR}/busybox --install -s {BUSYBOX_DIR}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{BUSYBOX_DIR}
export HOME=/root LANG=C.UTF-8 RUST_BACKTRACE=1
# The tests that size themselves for CI's minutes in a guest (hostile_storm) know they are in one.
export LEASH_VMTEST=1
# The tests of the daemon under its unit's restrictions run without the system call filter:
# the guests have no systemd-analyze to expand it.
export LEASH_TEST_SKIP_SYSTEMD=1
# Nor have they Node.js or pytest: the host libraries' test suites are left out (their kernel
# paths are the exec shim's, which exec_shim and pid_namespace test). The Python library's
# sources are there, for host_death's hosts.
export LEASH_TEST_SKIP_HOSTS=1
# Nor gdb: the ptrace guard's test checks gdb on the host only, and its helper everywhere.
export LEASH_TEST_NO_GDB=1
mount -t proc proc /proc
# The ptrace guard must be in the kernel's check (the LSM program where the BPF LSM is active,
# else fmod_ret), but on kernels without BPF trampolines for kernel functions (arm64 before
# 6.4), which the host says on the kernel's command line.
grep -q '{NO_TRAMPOLINES}' /proc/cmdline || export LEASH_TEST_REQUIRE_KERNEL_GUARD=1
mount -t sysfs sysfs /sys
# As systemd mounts it: the active LSMs are listed there.
mount -t securityfs securityfs /sys/kernel/security
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
{tmpfs}mount -t cgroup2 cgroup2 /sys/fs/cgroup
# A memory cgroup lives as long as the guest, as on a machine that systemd runs. Without one,
# each scenario's group turns the kernel's socket-accounting static key on and its removal turns
# it off: a patch of live kernel code each time, which multi-threaded emulation once got wrong
# (trixie-6.12 under TCG: an int3 oops in mem_cgroup_sk_alloc while another vCPU made a socket).
echo +memory > /sys/fs/cgroup/cgroup.subtree_control
mkdir /sys/fs/cgroup/vmtest-held
# As systemd mounts it: root's alone (bpffs defaults to 1777).
mount -t bpf -o mode=0700 bpf /sys/fs/bpf
ip link set lo up
# Every SIGKILL is recorded, so that a scenario that is SIGKILLed can be told who did it.
T=/sys/kernel/tracing
mount -t tracefs tracefs $T 2>/dev/null &&
    echo 'sig == 9' > $T/events/signal/signal_generate/filter &&
    echo 1 > $T/events/signal/signal_generate/enable
echo "{MARKER} kernel $(uname -r)"
# Whether the BPF LSM is active (its kernel's CONFIG_LSM, or an lsm= the host gave).
echo "active LSMs: $(cat /sys/kernel/security/lsm 2>/dev/null)"
cd {workdir}
"#,
        workdir = quote(&workdir.to_string_lossy()),
        tmpfs = TMPFS_DIRS.map(|dir| mount_tmpfs(dir, held)).concat(),
    )
}

/// The commands that mount a tmpfs on `dir` and put back over it what the image holds there
/// (`held`: the paths the image holds directly in each of [`TMPFS_DIRS`]).
fn mount_tmpfs(dir: &str, held: &[Held]) -> String {
    let held: Vec<&Held> = held
        .iter()
        .filter(|held| held.path.parent() == Some(Path::new(dir)))
        .collect();
    if held.is_empty() {
        return format!("mount -t tmpfs tmpfs {dir}\n");
    }
    let kept = format!("{IMAGE_DIR}{dir}");
    let mut script = format!(
        "# The image holds things in {dir}, which the tmpfs would hide: they are bound back.\n\
         mkdir -p {kept}\n\
         mount -o bind {dir} {kept}\n\
         mount -t tmpfs tmpfs {dir}\n"
    );
    for held in held {
        let path = held.path.to_string_lossy();
        let name = held.path.file_name().unwrap_or_default().to_string_lossy();
        let (to, from) = (quote(&path), quote(&format!("{kept}/{name}")));
        script.push_str(&match &held.kind {
            HeldKind::Dir => format!("mkdir {to} && mount -o bind {from} {to}\n"),
            HeldKind::File => format!("touch {to} && mount -o bind {from} {to}\n"),
            HeldKind::Symlink(target) => {
                format!("ln -s {} {to}\n", quote(&target.to_string_lossy()))
            }
        });
    }
    script
}

/// The script for the probe of an accelerator: it only reports and powers off.
pub(super) fn probe_script() -> String {
    format!(
        "#!{BUSYBOX_DIR}/busybox sh\n\
         {BUSYBOX_DIR}/busybox mount -t proc proc /proc\n\
         echo \"{MARKER} kernel $({BUSYBOX_DIR}/busybox uname -r)\"\n\
         {BUSYBOX_DIR}/busybox poweroff -f\n"
    )
}

/// `text` as one word of a shell command.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scenario_runs_its_tests_exactly_between_its_markers_with_the_arguments() {
        let binary = Path::new("/w/target/debug/deps/scenarios-0123456789");
        let fork_chain = ["fork_chain::a".to_owned(), "fork_chain::it's".to_owned()];
        let threads = ["threads::b".to_owned()];
        let tests = [
            GuestTest {
                name: "fork_chain",
                tests: &fork_chain,
            },
            GuestTest {
                name: "threads",
                tests: &threads,
            },
        ];
        let script = init_script(
            binary,
            &tests,
            &["--test-threads".into(), "1".into()],
            Path::new("/w/tests"),
            &[],
        );
        assert!(script.starts_with("#!/vmtest/bin/busybox sh\n"));
        let begin = script.find("@@vmtest begin fork_chain\"").unwrap();
        let run = script
            .find(
                "'/w/target/debug/deps/scenarios-0123456789' --exact 'fork_chain::a' \
                 'fork_chain::it'\\''s' '--test-threads' '1' </dev/null 2>&1",
            )
            .unwrap();
        let end = script.find("@@vmtest end fork_chain $status").unwrap();
        assert!(begin < run && run < end);
        // A guest booted again runs the scenarios the command line names.
        let run = script
            .find("run=$(sed -n 's/.*leash_vmtest.run=\\([0-9,]*\\).*/\\1/p' /proc/cmdline)\n")
            .unwrap();
        let guard = script
            .find("case \",${run:-all},\" in ,all,|*,0,*)\n")
            .unwrap();
        assert!(run < guard && guard < begin);
        assert!(script.contains("case \",${run:-all},\" in ,all,|*,1,*)\n"));
        let threads = script.find("@@vmtest begin threads\"").unwrap();
        assert!(end < threads);
        assert!(script.contains(" --exact 'threads::b' '--test-threads' '1' </dev/null"));
        assert!(script.contains(" comm=scenarios-01234 "));
        assert!(script.contains("cd '/w/tests'\n"));
        assert!(script.trim_end().ends_with("poweroff -f"));
        assert!(script.contains("\nmount -t tmpfs tmpfs /tmp\n"));
        assert!(!script.contains("mount -o bind"));
    }

    #[test]
    fn what_the_image_holds_in_tmp_is_bound_back_over_the_tmpfs_before_the_tests_run() {
        let held = [
            Held {
                path: "/tmp/clone".into(),
                kind: HeldKind::Dir,
            },
            Held {
                path: "/tmp/it's".into(),
                kind: HeldKind::File,
            },
            Held {
                path: "/tmp/link".into(),
                kind: HeldKind::Symlink("clone/tests".into()),
            },
        ];
        let script = init_script(
            Path::new("/tmp/clone/target/debug/deps/scenarios-0123"),
            &[],
            &[],
            Path::new("/tmp/clone/tests"),
            &held,
        );
        let order = [
            "mount -o bind /tmp /vmtest/image/tmp\n",
            "mount -t tmpfs tmpfs /tmp\n",
            "mkdir '/tmp/clone' && mount -o bind '/vmtest/image/tmp/clone' '/tmp/clone'\n",
            "touch '/tmp/it'\\''s' && mount -o bind '/vmtest/image/tmp/it'\\''s' '/tmp/it'\\''s'\n",
            "ln -s 'clone/tests' '/tmp/link'\n",
            "cd '/tmp/clone/tests'\n",
        ];
        let at: Vec<usize> = order
            .iter()
            .map(|line| {
                script
                    .find(line)
                    .unwrap_or_else(|| panic!("{line:?} in {script}"))
            })
            .collect();
        assert!(at.windows(2).all(|pair| pair[0] < pair[1]), "{script}");
        // /run holds nothing of the image's: a plain tmpfs.
        assert!(script.contains("\nmount -t tmpfs tmpfs /run\n"));
        assert!(!script.contains("/vmtest/image/run"));
    }
}
