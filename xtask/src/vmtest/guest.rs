//! What the guest runs as PID 1: a busybox shell script that sets the machine up as a modern
//! distribution has it (pure cgroup v2 at /sys/fs/cgroup, bpffs, /tmp and /run on tmpfs, lo up),
//! runs each test binary with its output straight on the serial console, and powers off. Marker
//! lines tell the host what is happening; nothing else in the output starts with [`MARKER`].

use std::path::Path;

use super::initramfs::BUSYBOX_DIR;

/// The start of every line the host reads as a report from init.
pub(super) const MARKER: &str = "@@vmtest";
/// How long one test binary may run in a guest before it is killed (the host's own timeout, for
/// the whole kernel, is the backstop).
pub(super) const BINARY_TIMEOUT_S: u64 = 600;

/// A test binary as the guest runs it.
pub(super) struct GuestTest<'a> {
    pub name: &'a str,
    pub path: &'a Path,
}

/// The init script. Its markers, one per line:
/// - `@@vmtest kernel RELEASE` once set up;
/// - `@@vmtest begin NAME` and `@@vmtest end NAME STATUS` around each test binary;
/// - `@@vmtest done` before powering off.
pub(super) fn init_script(tests: &[GuestTest], test_args: &[String], workdir: &Path) -> String {
    let mut script = format!(
        r#"#!{BUSYBOX_DIR}/busybox sh
# leash's integration tests in a virtual machine (cargo xtask vmtest).
{BUSYBOX_DIR}/busybox --install -s {BUSYBOX_DIR}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{BUSYBOX_DIR}
export HOME=/root LANG=C.UTF-8 RUST_BACKTRACE=1
# The tests of the daemon under its unit's restrictions run without the system call filter:
# the guests have no systemd-analyze to expand it.
export LEASH_TEST_SKIP_SYSTEMD=1
# Nor have they Node.js or the host libraries' sources: the tests that run a host library are
# left out (their kernel paths are the exec shim's, which exec_shim and pid_namespace test).
export LEASH_TEST_SKIP_HOSTS=1
# Nor gdb: the ptrace guard's test checks gdb on the host only, and its helper everywhere.
export LEASH_TEST_NO_GDB=1
# Debian's kernels have BPF trampolines: the ptrace guard must be the fmod_ret program there.
export LEASH_TEST_REQUIRE_FMOD_RET=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup
# As systemd mounts it: root's alone (bpffs defaults to 1777).
mount -t bpf -o mode=0700 bpf /sys/fs/bpf
ip link set lo up
# Every SIGKILL is recorded, so that a test binary that is SIGKILLed can be told who did it.
T=/sys/kernel/tracing
mount -t tracefs tracefs $T 2>/dev/null &&
    echo 'sig == 9' > $T/events/signal/signal_generate/filter &&
    echo 1 > $T/events/signal/signal_generate/enable
echo "{MARKER} kernel $(uname -r)"
cd {workdir}
"#,
        workdir = quote(&workdir.to_string_lossy()),
    );
    let args: String = test_args.iter().map(|a| format!(" {}", quote(a))).collect();
    for test in tests {
        // The kernel names a process after the first 15 bytes of its file's name.
        let file_name = test.path.file_name().unwrap_or_default().to_string_lossy();
        let comm: String = file_name.chars().take(15).collect();
        script.push_str(&format!(
            "echo > $T/trace 2>/dev/null\n\
             echo \"{MARKER} begin {name}\"\n\
             timeout -s KILL {BINARY_TIMEOUT_S} {path}{args} </dev/null 2>&1\n\
             status=$?\n\
             [ $status = 137 ] && grep -F ' comm={comm} ' $T/trace 2>/dev/null | tail -3 | sed 's/^/SIGKILL by /'\n\
             echo \"{MARKER} end {name} $status\"\n",
            name = test.name,
            path = quote(&test.path.to_string_lossy()),
        ));
    }
    script.push_str(&format!("echo \"{MARKER} done\"\npoweroff -f\n"));
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
    fn each_test_runs_between_its_markers_with_the_arguments() {
        let path = Path::new("/w/target/debug/deps/fork_chain-01");
        let tests = [GuestTest {
            name: "fork_chain",
            path,
        }];
        let script = init_script(
            &tests,
            &["it's".into(), "--exact".into()],
            Path::new("/w/tests"),
        );
        assert!(script.starts_with("#!/vmtest/bin/busybox sh\n"));
        let begin = script.find("@@vmtest begin fork_chain\"").unwrap();
        let run = script
            .find("'/w/target/debug/deps/fork_chain-01' 'it'\\''s' '--exact' </dev/null 2>&1")
            .unwrap();
        let end = script.find("@@vmtest end fork_chain $status").unwrap();
        assert!(script.contains(" comm=fork_chain-01 "));
        assert!(begin < run && run < end);
        assert!(script.contains("cd '/w/tests'\n"));
        assert!(script.trim_end().ends_with("poweroff -f"));
    }
}
