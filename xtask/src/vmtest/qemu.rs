//! Booting a kernel and an initramfs under QEMU, with the serial console as the only device, and
//! reading the console line by line until the guest powers off or a deadline passes.

use std::{
    fmt,
    fs::File,
    io::{BufRead, BufReader, Read},
    ops::ControlFlow,
    path::Path,
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    arch::{Arch, Guest},
    guest::MARKER,
};

/// Guest memory: the initramfs is unpacked into it (a few hundred MB), and two tests each hold
/// 1 GiB of touched memory. QEMU takes from the host only what the guest touches.
const MEMORY_MB: u32 = 3072;
const CPUS: u32 = 2;
/// How long a probe boot may take to reach init with an accelerator that works (a boot takes
/// about a second with KVM; with nested KVM broken it hangs or fails).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accel {
    Kvm,
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        })
    }
}

/// How a boot ended.
#[derive(Debug)]
pub(crate) enum Ending {
    /// QEMU exited (the guest powered off, or the kernel panicked and `panic=-1` rebooted it
    /// into `-no-reboot`).
    Exited,
    /// The deadline passed; QEMU was killed.
    TimedOut,
    /// The caller had seen enough; QEMU was killed.
    Stopped,
}

/// Boots the x86_64 `kernel` with `initrd`: see [`boot_on`].
pub(crate) fn boot(
    accel: Accel,
    kernel: &Path,
    initrd: &Path,
    timeout: Duration,
    on_line: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Ending> {
    boot_on(Arch::X86_64, accel, "", kernel, initrd, timeout, on_line)
}

/// Boots `kernel` of `arch` with `initrd` (and `cmdline` added to the kernel's command line),
/// calling `on_line` with each line of the console (and of QEMU's own errors, prefixed
/// `qemu: `), until QEMU exits, `timeout` passes or `on_line` breaks.
pub(crate) fn boot_on(
    arch: Arch,
    accel: Accel,
    cmdline: &str,
    kernel: &Path,
    initrd: &Path,
    timeout: Duration,
    mut on_line: impl FnMut(&str) -> ControlFlow<()>,
) -> Result<Ending> {
    let mut command = Command::new(arch.qemu());
    command
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            "stdio",
        ])
        .arg("-no-reboot")
        .args(["-m", &MEMORY_MB.to_string(), "-smp", &CPUS.to_string()])
        .args(match (arch, accel) {
            (Arch::X86_64, Accel::Kvm) => ["-accel", "kvm", "-cpu", "host"].as_slice(),
            // qemu64 rather than max: a tenth faster under emulation here, and Debian's kernels
            // and programs need no more than its x86-64 baseline.
            (Arch::X86_64, Accel::Tcg) => &["-accel", "tcg", "-cpu", "qemu64"],
            (Arch::Aarch64, Accel::Kvm) => &["-M", "virt", "-accel", "kvm", "-cpu", "host"],
            // max: every feature QEMU emulates, as the newest cores have (BTI, MTE, pointer
            // authentication...), with QEMU's own cheap pointer-authentication hash rather
            // than the architected one, which costs a third of the guest's time. (Neither
            // neoverse-n1 nor max with pointer authentication off started a daemon sooner.)
            (Arch::Aarch64, Accel::Tcg) => &[
                "-M",
                "virt",
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                "max,pauth-impdef=on",
            ],
        })
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        // quiet: the kernel's warnings and worse only. panic=-1: a panic ends the run at once.
        .arg("-append")
        .arg(format!("console={} quiet panic=-1 {cmdline}", arch.console()).trim_end())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut qemu = command
        .spawn()
        .with_context(|| format!("running {}", arch.qemu()))?;
    let (lines, received) = mpsc::channel();
    let readers = [
        forward(
            qemu.stdout.take().context("QEMU's output")?,
            "",
            lines.clone(),
        ),
        forward(
            qemu.stderr.take().context("QEMU's errors")?,
            "qemu: ",
            lines,
        ),
    ];
    let deadline = Instant::now() + timeout;
    let ending = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => {
                if on_line(&line).is_break() {
                    // By its own handle: the pid of the QEMU started here.
                    let _ = qemu.kill();
                    break Ending::Stopped;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break Ending::Exited,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = qemu.kill();
                break Ending::TimedOut;
            }
        }
    };
    // Its output is closed (or it was killed): reap it, then the readers.
    let _ = qemu.wait();
    for reader in readers {
        let _ = reader.join();
    }
    Ok(ending)
}

/// A thread that sends each line `from` gives (without its \r\n) to `to`.
fn forward(
    from: impl Read + Send + 'static,
    prefix: &'static str,
    to: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer);
                    let line = line.trim_end_matches(['\n', '\r']);
                    if to.send(format!("{prefix}{line}")).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// KVM when it works here, TCG otherwise: a short boot with KVM must reach init. On these
/// machines /dev/kvm exists but nested KVM fails (the guest hangs or QEMU reports "KVM internal
/// error"), and the probe costs its timeout once per run.
pub(super) fn choose_accel(kernel: &Path, probe_initrd: &Path) -> Result<Accel> {
    if File::options()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        eprintln!("xtask: /dev/kvm is not usable: the guests run under TCG (emulation)");
        return Ok(Accel::Tcg);
    }
    let started = Instant::now();
    let mut reached_init = false;
    let mut errors = Vec::new();
    let ending = boot(Accel::Kvm, kernel, probe_initrd, PROBE_TIMEOUT, |line| {
        if line.starts_with(&format!("{MARKER} kernel ")) {
            reached_init = true;
        } else if line.starts_with("qemu: ") {
            errors.push(line.to_owned());
            // QEMU stops the guest on an internal error and waits: no need to wait with it.
            if line.contains("KVM internal error") {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    if reached_init {
        eprintln!(
            "xtask: KVM works: a probe boot took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        return Ok(Accel::Kvm);
    }
    let why = match (ending, errors.first()) {
        (_, Some(error)) => error.trim_start_matches("qemu: ").to_owned(),
        (Ending::TimedOut, None) => format!(
            "a probe boot did not reach init in {} s",
            PROBE_TIMEOUT.as_secs()
        ),
        (_, None) => "a probe boot ended before init".to_owned(),
    };
    eprintln!("xtask: KVM does not work here ({why}): the guests run under TCG (emulation)");
    Ok(Accel::Tcg)
}
