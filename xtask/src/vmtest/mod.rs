//! `cargo xtask vmtest`: the integration tests on the kernels users run. Each Debian cloud
//! kernel of [`kernels::PINS`] boots under QEMU (KVM where it works, TCG otherwise) with an
//! initramfs that holds the test binary, `leash` and what the tests run; init runs the scenarios
//! one by one and powers off; the host reads the console.
//!
//! Kernels are cached outside the clone (/var/cache/leash-vmtest, or `LEASH_VMTEST_CACHE`);
//! the initramfs, the stripped binaries and each kernel's console log are build output, in
//! target/vmtest/.

pub(crate) mod apt;
mod arch;
pub(crate) mod bench_guest;
mod cpio;
mod guest;
mod initramfs;
mod kernels;
mod qemu;
mod report;
mod suite;
mod sysroot;

use std::{
    env,
    fs::{self, File},
    io::{BufWriter, Write},
    ops::ControlFlow,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{apt_install, is_root, setup, workspace_root};
use arch::Arch;
use guest::GuestTest;
use initramfs::Image;
pub(crate) use qemu::{Accel, Ending};
use report::{Console, ScenarioRun};

pub(crate) use apt::mirror;
pub(crate) use qemu::boot;

pub(crate) const CACHE_VAR: &str = "LEASH_VMTEST_CACHE";
const DEFAULT_CACHE: &str = "/var/cache/leash-vmtest";

#[derive(clap::Args)]
pub(crate) struct Options {
    /// Boot only this kernel; repeat for more. When absent, the default set: on x86_64
    /// bullseye-5.10, bookworm-6.1, trixie-6.12 and sid-newest (the newest cloud kernel of
    /// Debian unstable or experimental, looked up at each run); on arm64 bookworm-6.1 and
    /// trixie-6.12. bookworm-6.12 (x86_64) runs only when named: the same upstream line as
    /// trixie-6.12; so does sid-newest-nolsm, sid-newest's kernel booted with an lsm= list that
    /// lacks bpf (as Ubuntu's does).
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// The guests' architecture: x86_64 (this machine's), or arm64, emulated, with leash and
    /// the tests cross-built and the programs from Debian's arm64 packages.
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    arch: Arch,
    /// On arm64, every scenario the x86_64 guests run, rather than the subset CI has time for
    /// (`--list` names it).
    #[arg(long)]
    all: bool,
    /// The `leash` the guests' tests run, rather than the build's own (a release's binary, as
    /// a package ships it): it goes where the tests look for the build's. An ELF program of
    /// --arch's architecture.
    #[arg(long, value_name = "PATH")]
    leash: Option<PathBuf>,
    /// Run only this scenario (a module of the test binary: a file of tests/tests/, without
    /// .rs); repeat for more. May name one that is left out by default.
    #[arg(long = "test", value_name = "NAME")]
    tests: Vec<String>,
    /// kvm, tcg, or auto: KVM when a short probe boot works, TCG (emulation) otherwise.
    #[arg(long, default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    accel: String,
    /// How many kernels run at once. More than one helps only with CPUs to spare: on a
    /// 2-CPU host, two machines under emulation take as long together as one after the other.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// How long one kernel's run may take, in seconds, before its machine is stopped.
    #[arg(long, default_value_t = 1800, value_name = "SECONDS")]
    timeout: u64,
    /// List the kernels and the scenarios left out, with why, and run nothing.
    #[arg(long)]
    list: bool,
    /// After `--`: libtest's arguments, as to `cargo test -- ...`. Those that choose tests (a
    /// name filter, `--skip NAME`, `--exact`) choose them from the test binary's list here; the
    /// others (`--test-threads 1`, `--nocapture`) go to every scenario's run.
    #[arg(last = true, value_name = "TEST ARGS")]
    test_args: Vec<String>,
}

pub(crate) fn vmtest(options: &Options) -> Result<()> {
    let arch = options.arch;
    let pins = kernels::select(&options.kernels, arch)?;
    if options.list {
        list(arch);
        return Ok(());
    }
    if arch != Arch::X86_64 && options.accel == "kvm" {
        bail!(
            "{} guests run under emulation (TCG) here: --accel kvm is for x86_64 only",
            arch.debian()
        );
    }
    if !is_root() {
        eprintln!(
            "xtask: warning: not root: installing what is missing and writing {DEFAULT_CACHE} \
             need root (set {CACHE_VAR} to cache elsewhere)"
        );
    }
    if let Some(leash) = &options.leash {
        check_leash(leash, arch)?;
    }
    setup()?;
    ensure_tools_for(arch)?;
    let cache = cache_dir();
    let out = workspace_root().join("target/vmtest");
    fs::create_dir_all(out.join("logs")).with_context(|| format!("making {}", out.display()))?;

    let suite = suite::build(&options.tests, &options.test_args, arch, options.all)?;
    let kernels = kernels::resolve(&pins, &cache)?;

    let initrd = out.join(match arch {
        Arch::X86_64 => "initramfs.cpio".to_owned(),
        _ => format!("initramfs-{}.cpio", arch.debian()),
    });
    build_initramfs(&suite, options.leash.as_deref(), &out, &initrd, arch)?;
    let accel = match arch {
        Arch::X86_64 => accelerator(&options.accel, &kernels[0].vmlinuz, &out)?,
        _ => Accel::Tcg,
    };

    let timeout = Duration::from_secs(options.timeout);
    let scenarios: Vec<String> = suite.scenarios.iter().map(|s| s.name.clone()).collect();
    let results = run_kernels(&kernels, options.jobs.max(1), |kernel| {
        let result = run_kernel(kernel, accel, &initrd, &out, timeout, &scenarios)?;
        println!("{}", result.line());
        Ok(result)
    })?;
    summarize(&results)
}

/// The accelerator `choice` names (kvm, tcg), or for `auto` the one a short boot of `vmlinuz`
/// finds working (its probe's initramfs is made in `out`).
pub(crate) fn accelerator(choice: &str, vmlinuz: &Path, out: &Path) -> Result<Accel> {
    Ok(match choice {
        "kvm" => Accel::Kvm,
        "tcg" => Accel::Tcg,
        _ => {
            let probe = out.join("probe.cpio");
            build_probe_initramfs(out, &probe)?;
            qemu::choose_accel(vmlinuz, &probe)?
        }
    })
}

/// The kernel `name`d in [`kernels::PINS`], fetched into the cache if it is not there yet.
pub(crate) fn kernel(name: &str) -> Result<kernels::Kernel> {
    let pins = kernels::select(&[name.to_owned()], Arch::X86_64)?;
    kernels::resolve(&pins, &cache_dir())?
        .pop()
        .with_context(|| format!("no kernel {name}"))
}

/// Runs `run` on every kernel, `jobs` at a time; returns the results in the kernels' order.
fn run_kernels<'a>(
    kernels: &'a [kernels::Kernel],
    jobs: usize,
    run: impl Fn(&'a kernels::Kernel) -> Result<KernelResult<'a>> + Sync,
) -> Result<Vec<KernelResult<'a>>> {
    let next = Mutex::new(kernels.iter().enumerate());
    let results = Mutex::new(Vec::new());
    thread::scope(|scope| {
        for _ in 0..jobs.min(kernels.len()) {
            scope.spawn(|| {
                loop {
                    let Some((index, kernel)) = lock(&next).next() else {
                        return;
                    };
                    let result = run(kernel);
                    lock(&results).push((index, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

/// The value behind `mutex`, even if another thread panicked holding it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn list(arch: Arch) {
    println!(
        "kernels of {} (xtask/src/vmtest/kernels.rs; --arch x86_64 or arm64):",
        arch.debian()
    );
    for pin in kernels::PINS.iter().filter(|pin| pin.arch == arch) {
        let booted_with = if pin.cmdline.is_empty() {
            String::new()
        } else {
            format!(", booted with {}", pin.cmdline)
        };
        let default = pin
            .only_named
            .map(|why| format!(" [only with --kernel: {why}]"))
            .unwrap_or_default();
        println!(
            "  {:<16} {}{booted_with}{default}",
            pin.name,
            pin.describe()
        );
    }
    println!("scenarios left out (xtask/src/vmtest/suite.rs); every other one runs:");
    for (name, reason) in suite::LEFT_OUT {
        println!("  {name:<20} {reason}");
    }
    if arch == Arch::Aarch64 {
        println!(
            "on arm64, only these run unless --all or --test says otherwise (emulated arm64 \
             is slow, and CI has 8 minutes for it):\n  {}",
            suite::ARM64_SUBSET.join(" ")
        );
    }
}

/// QEMU, busybox, objcopy, dpkg-deb and Debian's Python, installed when missing.
pub(crate) fn ensure_tools() -> Result<()> {
    ensure_tools_for(Arch::X86_64)
}

/// What booting guests of `arch` needs: [`ensure_tools`], and for arm64 its QEMU (the cross
/// toolchain and the guest's programs come when the build needs them).
fn ensure_tools_for(arch: Arch) -> Result<()> {
    let mut needs = vec![
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("objcopy", "binutils"),
        ("dpkg-deb", "dpkg"),
        ("python3", "python3"),
    ];
    if arch == Arch::Aarch64 {
        needs.push(("qemu-system-aarch64", "qemu-system-arm"));
        needs.push(("readelf", "binutils"));
    }
    let present = |program: &str| {
        ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
            .iter()
            .any(|dir| Path::new(dir).join(program).is_file())
    };
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(program, _)| !present(program))
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing, false)
}

pub(crate) fn cache_dir() -> PathBuf {
    env::var_os(CACHE_VAR).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// The binaries of the build the tests run, beside the test binary: `leash`, and the tests
/// crate's helpers (tests/src/bin/).
const GUEST_PROGRAMS: [&str; 2] = ["leash", "ptrace-probe"];

/// Fails unless `leash` (--leash) is a program the guests of `arch` can run.
fn check_leash(leash: &Path, arch: Arch) -> Result<()> {
    arch.check_elf(leash)
        .with_context(|| format!("--leash {} for {} guests", leash.display(), arch.debian()))?;
    let mode = fs::metadata(leash)
        .with_context(|| format!("reading {}", leash.display()))?
        .permissions()
        .mode();
    if mode & 0o111 == 0 {
        bail!(
            "--leash {} is not executable (mode {mode:o}): chmod +x it",
            leash.display()
        );
    }
    Ok(())
}

/// The initramfs of the test run: see initramfs.rs; with `leash` (--leash) as the tests'
/// `leash` if given. Returns its size.
fn build_initramfs(
    suite: &suite::Suite,
    leash: Option<&Path>,
    out: &Path,
    to: &Path,
    arch: Arch,
) -> Result<u64> {
    let mut image = Image::for_guest(&out.join("stripped"), arch)?;
    // The cross builds have no debug information to strip.
    let strip = arch == Arch::X86_64;
    initramfs::add_host_programs(&mut image)?;
    image.add_host_file(&suite.binary, strip)?;
    // The tests run the `leash` of their build: target/PROFILE/leash, beside their deps/; and
    // the tests crate's own helper binaries, which cargo puts there too.
    for program in GUEST_PROGRAMS {
        let path = suite
            .binary
            .parent()
            .and_then(Path::parent)
            .map(|dir| dir.join(program))
            .filter(|path| path.is_file())
            .with_context(|| format!("no {program} binary beside the test binary"))?;
        match leash.filter(|_| program == "leash") {
            Some(leash) => image.add_host_file_at(leash, &path, strip)?,
            None => image.add_host_file(&path, strip)?,
        }
    }
    // The Python host library, which the hosts of host_death import from the source tree.
    let library = workspace_root().join("clients/python/src");
    image.add_host_tree(&library, &|path| path.ends_with("__pycache__"))?;
    // cargo runs a test binary in its package's directory.
    let workdir = workspace_root().join("tests");
    image.add_dir(&workdir);
    add_etc(&mut image);
    let tests: Vec<GuestTest> = suite
        .scenarios
        .iter()
        .map(|scenario| GuestTest {
            name: &scenario.name,
            tests: &scenario.tests,
        })
        .collect();
    // A checkout under /tmp puts the test binaries where init mounts a tmpfs.
    let held = guest::held(&image);
    image.add_text(
        "/init",
        guest::init_script(&suite.binary, &tests, &suite.run_args, &workdir, &held),
        0o755,
    );
    let size = image.write(to)?;
    eprintln!(
        "xtask: initramfs of {} scenarios ({} tests), {} files: {} MB",
        tests.len(),
        tests.iter().map(|test| test.tests.len()).sum::<usize>(),
        image.file_count(),
        size / 1_000_000
    );
    Ok(size)
}

/// The initramfs of the accelerator's probe: busybox and a script that reports and powers off.
fn build_probe_initramfs(out: &Path, to: &Path) -> Result<()> {
    let mut image = Image::new(&out.join("stripped"));
    initramfs::add_busybox(&mut image)?;
    image.add_text("/init", guest::probe_script(), 0o755);
    image.write(to)?;
    Ok(())
}

/// The few files of /etc that programs look for.
fn add_etc(image: &mut Image) {
    image.add_text(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            .to_owned(),
        0o644,
    );
    image.add_text(
        "/etc/group",
        "root:x:0:\nnogroup:x:65534:\n".to_owned(),
        0o644,
    );
    image.add_text(
        "/etc/hosts",
        "127.0.0.1 localhost\n::1 localhost\n".to_owned(),
        0o644,
    );
}

/// What names a kernel of another architecture than this machine's apart (its pins share the
/// x86 ones' names): `arm64` and `then`; nothing on x86_64.
fn arch_prefix(arch: Arch, then: &str) -> String {
    match arch {
        Arch::X86_64 => String::new(),
        arch => format!("{}{then}", arch.debian()),
    }
}

/// One kernel's run.
struct KernelResult<'a> {
    kernel: &'a kernels::Kernel,
    accel: Accel,
    console: Console,
    ending: Ending,
    took: Duration,
    /// Where the guest oopsed on an int3 and was booted again, each time.
    resumed_in: Vec<String>,
    /// The first runs of the scenarios that failed on the newest kernel and ran again.
    first_tries: Vec<ScenarioRun>,
}

impl KernelResult<'_> {
    /// `vmtest: bullseye-5.10 5.10.0-46-cloud-amd64 (5.10.262-1, tcg): 74 passed, 0 failed,
    /// 0 skipped in 212 s`, and what went wrong besides failed tests.
    fn line(&self) -> String {
        let kernel = self.kernel;
        let (passed, failed, ignored) = self.console.totals();
        let pin = if kernel.pinned { "" } else { ", NOT THE PIN" };
        // The newest kernel is whatever Debian ships today: the line says which.
        let package = if kernel.newest {
            format!("{} ", kernel.package)
        } else {
            String::new()
        };
        let arch = arch_prefix(kernel.arch, " ");
        let mut line = format!(
            "vmtest: {arch}{} {} ({package}{}{pin}, {}): {passed} passed, {failed} failed, {ignored} skipped in {} s",
            kernel.name,
            kernel.release,
            kernel.version,
            self.accel,
            self.took.as_secs()
        );
        if !self.resumed_in.is_empty() {
            line.push_str(&format!(
                "; booted again after an int3 oops of emulation's in {}",
                self.resumed_in.join(", ")
            ));
        }
        if !self.first_tries.is_empty() {
            let failures: Vec<String> = self
                .first_tries
                .iter()
                .flat_map(ScenarioRun::problems)
                .collect();
            line.push_str(&format!(
                "; failed at first and ran again (its second run counts): {}",
                failures.join(", ")
            ));
        }
        if let Some(trouble) = self.trouble() {
            line.push_str(&format!("; {trouble}"));
        }
        line
    }

    /// What stopped the run short, if anything did.
    fn trouble(&self) -> Option<String> {
        let unfinished = self.console.unfinished().map(|run| run.name.as_str());
        match (&self.ending, self.console.started, self.console.done) {
            (_, _, true) => None,
            (Ending::TimedOut, _, _) => Some(format!(
                "TIMED OUT{}",
                unfinished.map(|n| format!(" in {n}")).unwrap_or_default()
            )),
            (_, false, _) => Some("the guest never reached init".to_owned()),
            (_, true, _) => Some(format!(
                "the guest stopped before the end (a kernel panic?){}",
                unfinished.map(|n| format!(" in {n}")).unwrap_or_default()
            )),
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = self.console.problems();
        if let Some(trouble) = self.trouble() {
            // The trouble names the scenario that did not finish.
            if let Some(unfinished) = self.console.unfinished() {
                problems.retain(|problem| !problem.starts_with(&format!("{} (", unfinished.name)));
            }
            problems.push(trouble);
        }
        problems
    }
}

/// How many times one kernel's guest is booted again after an int3 oops
/// ([`Console::patch_oops`]) under emulation. Such oopses are rare: one in daemon_restart on
/// 7.3-rc7 (the ptrace guard's trampoline patched in at a daemon's start), one on 6.12 (a static
/// key), each in a run of every scenario that was otherwise clean.
const RESUMES_AFTER_PATCH_OOPS: usize = 2;

/// On the newest kernel without the BPF LSM alone (`sid-newest-nolsm`:
/// [`kernels::Kernel::retried`]), the failed scenarios run once more, in a new guest, when no
/// more than this many failed. 7.x skips the fork and exit programs now and then, and without
/// the marks any test of tracking can meet a fork no program saw (README, "Kernels"): one run
/// of every scenario on 7.3-rc7 lost `kill_threads` so. A scenario that fails twice fails; more
/// failures than this are not a skip's doing, and stand at once. Not on `sid-newest`: its
/// marks keep every fork seen, and a second chance would hide an escape.
const RETRIED_ON_THE_NEWEST: usize = 2;

/// Boots `kernel` with `initrd`, whose init runs `scenarios` (by name, in the image's order),
/// and reads its console; boots it again to go on after an oops of emulation's, and on the
/// newest kernel to run its few failures again.
fn run_kernel<'a>(
    kernel: &'a kernels::Kernel,
    accel: Accel,
    initrd: &Path,
    out: &Path,
    timeout: Duration,
    scenarios: &[String],
) -> Result<KernelResult<'a>> {
    let log_path = out.join("logs").join(format!(
        "{}{}.log",
        arch_prefix(kernel.arch, "-"),
        kernel.name
    ));
    let mut log = BufWriter::new(
        File::create(&log_path).with_context(|| format!("writing {}", log_path.display()))?,
    );
    let booted_with = if kernel.cmdline.is_empty() {
        String::new()
    } else {
        format!(", with {}", kernel.cmdline)
    };
    println!(
        "vmtest: booting {}{} {} ({} {}) under {accel}{booted_with}",
        arch_prefix(kernel.arch, " "),
        kernel.name,
        kernel.release,
        kernel.package,
        kernel.version
    );
    let started = Instant::now();
    let mut console = Console::default();
    let mut resumed_in = Vec::new();
    let mut first_tries = Vec::new();
    // The scenarios the next boot runs, by their place in the image's list; None: all.
    let mut run: Option<Vec<usize>> = None;
    let ending = loop {
        let mut cmdline = kernel.cmdline.to_owned();
        if !kernel.trampolines {
            cmdline.push_str(&format!(" {}", guest::NO_TRAMPOLINES));
        }
        if let Some(run) = &run {
            let places: Vec<String> = run.iter().map(ToString::to_string).collect();
            cmdline.push_str(&format!(" {}={}", guest::RUN, places.join(",")));
        }
        console.reboot();
        let ending = qemu::boot_on(
            kernel.arch,
            accel,
            cmdline.trim_start(),
            &kernel.vmlinuz,
            initrd,
            timeout.saturating_sub(started.elapsed()),
            |line| {
                let _ = writeln!(log, "{line}");
                console.read(line);
                // The firmware's and the boot's noise only go to the log.
                if console.started || line.starts_with("qemu: ") {
                    println!("{}| {line}", kernel.name);
                }
                ControlFlow::Continue(())
            },
        )?;
        // An oops of emulation's making, not the kernel's nor leash's: the rest runs in a
        // new guest, from the scenario it stopped in. Under KVM the oops would be a finding.
        if accel == Accel::Tcg
            && matches!(ending, Ending::Exited)
            && console.patch_oops
            && !console.done
            && resumed_in.len() < RESUMES_AFTER_PATCH_OOPS
        {
            let at = console
                .forget_unfinished()
                .unwrap_or_else(|| "between two scenarios".to_owned());
            println!(
                "vmtest: {} oopsed on an int3 in {at}: a patch of the kernel's own code that \
                 emulation got wrong (README, \"On other kernels\"); booting it again to go on \
                 from there",
                kernel.name
            );
            resumed_in.push(at);
            let planned = |place: &usize| run.as_ref().is_none_or(|run| run.contains(place));
            run = Some(
                (0..scenarios.len())
                    .filter(|place| planned(place) && !console.finished(&scenarios[*place]))
                    .collect(),
            );
            continue;
        }
        let failed = console.failed();
        if kernel.retried
            && console.done
            && first_tries.is_empty()
            && !failed.is_empty()
            && failed.len() <= RETRIED_ON_THE_NEWEST
        {
            println!(
                "vmtest: {} failed {}: running it again in a new guest, once (the newest \
                 kernel skips the programs now and then: README, \"Open finding on 7.2 and \
                 7.3\")",
                kernel.name,
                failed.join(", ")
            );
            run = Some(
                (0..scenarios.len())
                    .filter(|place| failed.contains(&scenarios[*place]))
                    .collect(),
            );
            first_tries = console.take(&failed);
            continue;
        }
        break ending;
    };
    log.flush()?;
    let took = started.elapsed();
    eprintln!(
        "xtask: the console of {} is in {}",
        kernel.name,
        log_path.display()
    );
    Ok(KernelResult {
        kernel,
        accel,
        console,
        ending,
        took,
        resumed_in,
        first_tries,
    })
}

/// The per-kernel lines again, the failures by kernel, and the total: `tests: N passed, M
/// failed, K skipped`, as `cargo xtask test` ends.
fn summarize(results: &[KernelResult]) -> Result<()> {
    println!();
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    let mut failing = Vec::new();
    for result in results {
        println!("{}", result.line());
        let (p, f, i) = result.console.totals();
        passed += p;
        failed += f;
        ignored += i;
        let problems = result.problems();
        if !problems.is_empty() {
            failing.push((result.kernel.name, problems));
        }
    }
    for (kernel, problems) in &failing {
        println!("vmtest: {kernel} failed: {}", problems.join(", "));
    }
    println!("tests: {passed} passed, {failed} failed, {ignored} skipped");
    if !failing.is_empty() {
        bail!(
            "the tests failed on {}",
            failing
                .iter()
                .map(|(k, _)| *k)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
