//! `cargo xtask bench --arch arm64`: the benchmarks' overhead section in an arm64 guest. leash
//! and leash-bench are cross-built (release, as the x86 benchmarks run them), an arm64 cloud
//! kernel boots under emulation with an initramfs of them, the vmtest guests' programs and init's
//! set-up, leash-bench runs the overhead section alone (the only one that needs no C compiler,
//! which the guest lacks) and init prints its report on the console between markers; its ratios
//! become BENCHMARKS.md's arm64 section (bench_section.rs).

use std::{
    fs::{self, File},
    io::{BufWriter, Write},
    ops::ControlFlow,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    Accel, Ending, add_etc, arch::Arch, cache_dir, ensure_tools_for, guest, initramfs,
    initramfs::Image, kernels, qemu, suite,
};
use crate::{bench_section, setup, status, workspace_root};

/// The kernel the benchmarks boot unless `--kernel` names another: the newest arm64 pin that
/// attaches the ptrace guard in the kernel's check (BPF trampolines), as the x86 machines do.
pub(crate) const DEFAULT_KERNEL: &str = "trixie-6.12";
/// How long the guest may run: a full run's overhead section under emulation takes tens of
/// minutes on a busy 2-core host.
const TIMEOUT: Duration = Duration::from_secs(3 * 3600);
/// Where the guest's leash-bench writes its report.
const GUEST_REPORT: &str = "/tmp/leash-bench.md";
/// The markers init prints around the report (guest::MARKER's lines are init's alone).
const REPORT_BEGIN: &str = "report begin";
const REPORT_END: &str = "report end";

/// Runs the overhead section in an arm64 guest of `kernel` (its pin's name) and puts its ratios
/// into `report` (BENCHMARKS.md) as [`bench_section::TITLE`]. `quick`: leash-bench's shorter
/// plan.
pub(crate) fn bench(kernel: &str, quick: bool, report: &Path) -> Result<()> {
    let arch = Arch::Aarch64;
    let pins = kernels::select(&[kernel.to_owned()], arch)?;
    setup()?;
    ensure_tools_for(arch)?;
    let started = Instant::now();
    let bench = cross_build(arch)?;
    let kernel = kernels::resolve(&pins, &cache_dir())?
        .pop()
        .with_context(|| format!("no kernel {kernel}"))?;
    let out = workspace_root().join("target/vmtest");
    fs::create_dir_all(out.join("logs")).with_context(|| format!("making {}", out.display()))?;
    let initrd = out.join(format!("initramfs-bench-{}.cpio", arch.debian()));
    build_initramfs(&bench, quick, &out, &initrd, arch)?;
    // Other work on this machine slows the emulated one: the section says how busy it was.
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(", ");
    let log_path = out
        .join("logs")
        .join(format!("bench-{}-{}.log", arch.debian(), kernel.name));
    println!(
        "bench: booting {} {} {} under tcg (host load {load})",
        arch.debian(),
        kernel.name,
        kernel.release
    );
    let booted = Instant::now();
    let console = run_guest(&kernel, &initrd, &log_path)?;
    let took = booted.elapsed();
    eprintln!("xtask: the guest's console is in {}", log_path.display());
    if console.status != Some(0) {
        bail!(
            "leash-bench failed in the guest ({}); its console is in {}",
            console
                .status
                .map_or_else(|| "it never finished".to_owned(), |s| format!("status {s}")),
            log_path.display()
        );
    }
    let ratios = bench_section::ratios(&console.report)
        .with_context(|| format!("reading the guest's report (in {})", log_path.display()))?;
    let about = format!(
        "Debian's {} arm64 cloud kernel ({}), 2 emulated CPUs; `cargo xtask bench --arch \
         arm64{}` (leash-bench's {} plan); the guest took {:.0} s, and the host's load average \
         (1, 5, 15 min) as it booted was {load}.",
        kernel.name,
        console.release.as_deref().unwrap_or(&kernel.release),
        if quick { " --quick" } else { "" },
        if quick { "quick" } else { "full" },
        took.as_secs_f64(),
    );
    let section = bench_section::section(&ratios, &about);
    let old = fs::read_to_string(report).unwrap_or_default();
    fs::write(
        report,
        bench_section::splice(&old, bench_section::TITLE, &section),
    )
    .with_context(|| format!("writing {}", report.display()))?;
    print!("{section}");
    eprintln!(
        "xtask: wrote the arm64 section into {} ({:.0} s in all, the guest {:.0} s)",
        report.display(),
        started.elapsed().as_secs_f64(),
        took.as_secs_f64()
    );
    Ok(())
}

/// leash and leash-bench for `arch`, release, cross-built as the vmtest guests' builds are
/// (suite.rs); returns leash-bench's path (`leash` is beside it, where the benchmarks' daemons
/// find it).
fn cross_build(arch: Arch) -> Result<PathBuf> {
    let mut cargo = suite::cross_cargo_build(arch)?;
    cargo.args([
        "--release",
        "--package",
        "leash-user",
        "--bin",
        "leash",
        "--package",
        "leash-bench",
        "--bin",
        "leash-bench",
    ]);
    eprintln!(
        "xtask: cross-building leash and leash-bench (release) for {}",
        arch.rust_target()
    );
    status(&mut cargo)?;
    let dir = suite::cross_target_dir()
        .join(arch.rust_target())
        .join("release");
    for program in ["leash", "leash-bench"] {
        arch.check_elf(&dir.join(program))?;
    }
    Ok(dir.join("leash-bench"))
}

/// The guest's initramfs: the vmtest guests' programs and /etc, leash-bench and `leash` at
/// their build paths, and an init that runs the overhead section and prints its report.
fn build_initramfs(bench: &Path, quick: bool, out: &Path, to: &Path, arch: Arch) -> Result<()> {
    let mut image = Image::for_guest(&out.join("stripped"), arch)?;
    initramfs::add_host_programs(&mut image)?;
    image.add_host_file(bench, false)?;
    image.add_host_file(&bench.with_file_name("leash"), false)?;
    add_etc(&mut image);
    let held = guest::held(&image);
    image.add_text("/init", init_script(bench, quick, &held, arch), 0o755);
    let size = image.write(to)?;
    eprintln!(
        "xtask: the benchmarks' initramfs, {} files: {} MB",
        image.file_count(),
        size / 1_000_000
    );
    Ok(())
}

/// init: the vmtest guests' set-up, then leash-bench's overhead section, its report between
/// markers, its status, and power off.
fn init_script(bench: &Path, quick: bool, held: &[initramfs::Held], arch: Arch) -> String {
    let marker = guest::MARKER;
    let mut script = guest::setup_script("leash's benchmarks", Path::new("/root"), held);
    let bench = bench.to_string_lossy().replace('\'', r"'\''");
    let quick = if quick { " --quick" } else { "" };
    script.push_str(&format!(
        "# Kernel messages would break into the report's lines on the {console} console.\n\
         dmesg -n 1\n\
         '{bench}' --only overhead{quick} --out {GUEST_REPORT} </dev/null 2>&1\n\
         status=$?\n\
         echo \"{marker} {REPORT_BEGIN}\"\n\
         cat {GUEST_REPORT} 2>/dev/null\n\
         echo \"{marker} {REPORT_END} $status\"\n\
         echo \"{marker} done\"\n\
         poweroff -f\n",
        console = super::arch::Guest::console(arch),
    ));
    script
}

/// What the guest's console said.
#[derive(Default)]
struct Console {
    /// `uname -r`, from init's first marker.
    release: Option<String>,
    /// The report leash-bench wrote, as init printed it.
    report: String,
    /// leash-bench's exit status, once init said it.
    status: Option<i32>,
    /// Between the report's markers.
    in_report: bool,
}

impl Console {
    fn read(&mut self, line: &str) {
        let Some(said) = line.strip_prefix(guest::MARKER).map(str::trim) else {
            if self.in_report {
                self.report.push_str(line);
                self.report.push('\n');
            }
            return;
        };
        if let Some(release) = said.strip_prefix("kernel ") {
            self.release = Some(release.to_owned());
        } else if said == REPORT_BEGIN {
            self.in_report = true;
        } else if let Some(status) = said.strip_prefix(REPORT_END) {
            self.in_report = false;
            self.status = status.trim().parse().ok();
        }
    }
}

/// Boots `kernel` with `initrd`, the console shown (all but the report, which the section
/// gives) and logged in `log_path`; what it said.
fn run_guest(kernel: &kernels::Kernel, initrd: &Path, log_path: &Path) -> Result<Console> {
    let mut log = BufWriter::new(
        File::create(log_path).with_context(|| format!("writing {}", log_path.display()))?,
    );
    let mut console = Console::default();
    let mut started = false;
    let ending = qemu::boot_on(
        kernel.arch,
        Accel::Tcg,
        "",
        &kernel.vmlinuz,
        initrd,
        TIMEOUT,
        |line| {
            let _ = writeln!(log, "{line}");
            console.read(line);
            started |= console.release.is_some();
            if (started && !console.in_report) || line.starts_with("qemu: ") {
                println!("{}| {line}", kernel.name);
            }
            ControlFlow::Continue(())
        },
    )?;
    log.flush()?;
    if matches!(ending, Ending::TimedOut) {
        bail!(
            "the guest did not finish in {} s; its console is in {}",
            TIMEOUT.as_secs(),
            log_path.display()
        );
    }
    Ok(console)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_runs_the_overhead_section_alone_and_prints_its_report_between_markers() {
        let script = init_script(
            Path::new("/w/target/cross/aarch64-unknown-linux-gnu/release/leash-bench"),
            true,
            &[],
            Arch::Aarch64,
        );
        let run = script
            .find(
                "'/w/target/cross/aarch64-unknown-linux-gnu/release/leash-bench' --only overhead \
                 --quick --out /tmp/leash-bench.md",
            )
            .unwrap();
        let begin = script.find("echo \"@@vmtest report begin\"").unwrap();
        let end = script.find("echo \"@@vmtest report end $status\"").unwrap();
        assert!(script.find("mount -t bpf").unwrap() < run);
        assert!(run < begin && begin < end);
        assert!(script.trim_end().ends_with("poweroff -f"));
    }

    #[test]
    fn the_console_gives_the_report_between_its_markers_and_the_status() {
        let mut console = Console::default();
        for line in [
            "[    1.0] booting",
            "@@vmtest kernel 6.12.48+deb13-cloud-arm64",
            "leash-bench: progress",
            "@@vmtest report begin",
            "# leash benchmarks",
            "",
            "| a | b |",
            "@@vmtest report end 0",
            "@@vmtest done",
        ] {
            console.read(line);
        }
        assert_eq!(
            console.release.as_deref(),
            Some("6.12.48+deb13-cloud-arm64")
        );
        assert_eq!(console.report, "# leash benchmarks\n\n| a | b |\n");
        assert_eq!(console.status, Some(0));
        let mut unfinished = Console::default();
        unfinished.read("@@vmtest report begin");
        assert_eq!(unfinished.status, None);
    }
}
