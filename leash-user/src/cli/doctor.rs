//! `leash doctor`: whether the daemon can run on this machine and whether this process reaches
//! it; for each problem, what is wrong and the command or setting that fixes it. The JSON shape
//! is in docs/JSON.md.
//!
//! Every check is bounded in time (a daemon that takes the connection and never answers must
//! not hang the doctor), and the probes that load BPF leave nothing behind: they pin nothing,
//! and close what they loaded and attached.

use std::{
    fs,
    io::{self, ErrorKind, Write},
    os::{fd::AsFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::Result;
use clap::Args;
use leash::kernel::{Pins, support};
use leash_client::{
    Client, Error as ClientError, StatusInfo,
    protocol::{DEFAULT_SOCKET, PROTOCOL_VERSION},
};
use leash_common::ABI_VERSION;
use serde::Serialize;

/// How long the daemon has to answer, and any other check to finish.
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long the probes that load BPF (and parse the kernel's BTF) may take.
const BPF_TIMEOUT: Duration = Duration::from_secs(20);
/// Where bpffs is mounted by convention, and the daemon's default pin directory.
const BPFFS: &str = "/sys/fs/bpf";
const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/leash";
/// The inode number of the initial pid namespace (PROC_PID_INIT_INO), the host's.
const INITIAL_PID_NAMESPACE: u32 = 0xEFFF_FFFC;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print JSON (one document: the findings and a verdict) instead of text.
    #[arg(long)]
    json: bool,
    /// The daemon's pin directory, looked at when the daemon cannot be asked where it pins.
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
}

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Ok,
    /// Works, with a caveat worth knowing.
    Warn,
    /// The daemon cannot run here, or cannot be reached.
    Fail,
    /// Not checked: this needs privileges the caller lacks.
    NeedsRoot,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::NeedsRoot => "ROOT?",
        }
    }
}

#[derive(Debug, Serialize)]
struct Finding {
    name: &'static str,
    status: Status,
    /// What was found; for anything but ok, what is wrong.
    message: String,
    /// The command or setting that fixes it; absent when there is nothing to fix.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Finding {
    fn new(name: &'static str, status: Status, message: impl Into<String>) -> Self {
        Self {
            name,
            status,
            message: message.into(),
            fix: None,
        }
    }

    fn ok(name: &'static str, message: impl Into<String>) -> Self {
        Self::new(name, Status::Ok, message)
    }

    fn with_fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

#[derive(Debug, Serialize)]
struct Report {
    /// `ok`: every finding ok; `warn`: the daemon runs and is reached, with warnings or
    /// checks that need root; `fail`: something fails (exit status 1).
    verdict: Status,
    /// This leash's version, and the daemon's when it answered.
    version: &'static str,
    daemon_version: Option<String>,
    socket: PathBuf,
    findings: Vec<Finding>,
}

pub fn doctor(socket: &Path, args: DoctorArgs) -> Result<ExitCode> {
    let root = is_root();
    let daemon = bounded(TIMEOUT, {
        let socket = socket.to_owned();
        move || ask_daemon(&socket)
    })
    .unwrap_or(Err(DaemonError::Silent));

    let mut findings = Vec::new();
    findings.extend(kernel_findings(root));
    findings.push(bounded(TIMEOUT, bpffs).unwrap_or_else(|| timed_out("bpffs")));
    findings.push(
        bounded(TIMEOUT, {
            let socket = socket.to_owned();
            move || socket_dir(&socket)
        })
        .unwrap_or_else(|| timed_out("socket_dir")),
    );
    findings.push(pid_namespace(daemon.as_ref().ok()));
    findings.push(daemon_finding(socket, &daemon));
    let pinned_at = daemon.as_ref().ok().map(|d| d.status.pinned_at.clone());
    findings.push(
        bounded(TIMEOUT, {
            let pin_dir = args.pin_dir.clone();
            move || pins(pinned_at, &pin_dir, root)
        })
        .unwrap_or_else(|| timed_out("pins")),
    );

    let verdict = if findings.iter().any(|f| f.status == Status::Fail) {
        Status::Fail
    } else if findings.iter().all(|f| f.status == Status::Ok) {
        Status::Ok
    } else {
        Status::Warn
    };
    let report = Report {
        verdict,
        version: env!("CARGO_PKG_VERSION"),
        daemon_version: daemon.ok().map(|d| d.status.daemon_version),
        socket: socket.to_owned(),
        findings,
    };
    let mut out = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", text(&report))?;
    }
    Ok(if verdict == Status::Fail {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn text(report: &Report) -> String {
    let mut text = String::new();
    for finding in &report.findings {
        text += &format!(
            "{:<5}  {:<26} {}\n",
            finding.status.label(),
            finding.name,
            finding.message
        );
        if let (Some(fix), Status::Fail | Status::Warn) = (&finding.fix, finding.status) {
            text += &format!("{:33}fix: {fix}\n", "");
        }
    }
    if report
        .findings
        .iter()
        .any(|f| f.status == Status::NeedsRoot)
    {
        text += "the checks marked ROOT? need root: run `sudo leash doctor` for them\n";
    }
    text += &match report.verdict {
        Status::Ok => "the daemon can run here, and answers\n".to_owned(),
        Status::Warn => "the daemon answers; see the warnings above\n".to_owned(),
        _ => "leash is not ready here: fix what FAILs above\n".to_owned(),
    };
    text
}

/// Runs `check` on a thread of its own and waits `timeout` for it: None if it did not finish
/// (the thread is left to end with the process).
fn bounded<T: Send + 'static>(
    timeout: Duration,
    check: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(check());
    });
    rx.recv_timeout(timeout).ok()
}

fn timed_out(name: &'static str) -> Finding {
    Finding::new(
        name,
        Status::Fail,
        format!("the check did not finish within {} s", TIMEOUT.as_secs()),
    )
    .with_fix("run it again; if it hangs again, look at what blocks (a hung file system?)")
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

const NEEDS_ROOT_FIX: &str = "run `sudo leash doctor` to check it";

/// The kernel: its version, BTF, lockdown, the bpf(2) system call, and what the programs need
/// (kernel/support.rs's probes, every one of them).
fn kernel_findings(root: bool) -> Vec<Finding> {
    let mut findings = Vec::new();
    let release = support::release();
    findings.push(match support::meets_floor() {
        Some(true) => Finding::ok(
            "kernel",
            format!(
                "Linux {release} ({} or later needed)",
                support::KERNEL_FLOOR
            ),
        ),
        Some(false) => Finding::new(
            "kernel",
            Status::Warn,
            format!(
                "Linux {release} is older than {}: leash runs only if the distribution \
                 backported what the checks below probe",
                support::KERNEL_FLOOR
            ),
        )
        .with_fix(format!(
            "boot a kernel of Linux {} or later (every major distribution's current one)",
            support::KERNEL_FLOOR
        )),
        None => Finding::new(
            "kernel",
            Status::Warn,
            "the kernel's version cannot be read",
        ),
    });

    findings.push(match support::lockdown() {
        Some(mode) if mode == "confidentiality" => Finding::new(
            "lockdown",
            Status::Fail,
            "kernel lockdown is `confidentiality`: it refuses the kernel reads the programs make \
             (bpf_probe_read_kernel)",
        )
        .with_fix(
            "boot with lockdown=integrity (or none) on the kernel command line, e.g. in \
             GRUB_CMDLINE_LINUX; integrity is enough for leash",
        ),
        Some(mode) => Finding::ok(
            "lockdown",
            format!("kernel lockdown is `{mode}`: it allows what the programs do"),
        ),
        None => Finding::ok(
            "lockdown",
            "no lockdown mode to read (no /sys/kernel/security/lockdown): nothing is locked \
             down, or securityfs is not mounted; the probes below tell",
        ),
    });

    let syscall = bounded(TIMEOUT, support::bpf_syscall);
    let bpf_usable = matches!(syscall, Some(Ok(())));
    findings.push(match syscall {
        None => timed_out("bpf_syscall"),
        Some(Ok(())) => Finding::ok("bpf_syscall", "bpf(2) is allowed to this process"),
        Some(Err(e)) if e.raw_os_error() == Some(libc::ENOSYS) => Finding::new(
            "bpf_syscall",
            Status::Fail,
            "this kernel has no bpf(2) system call",
        )
        .with_fix("boot a kernel built with CONFIG_BPF_SYSCALL=y (every major distribution's is)"),
        Some(Err(e)) if is_denied(&e) && !root => Finding::new(
            "bpf_syscall",
            Status::NeedsRoot,
            "needs root to check bpf(2): the daemon runs as root, and bpf(2) is refused to \
             other users",
        )
        .with_fix(NEEDS_ROOT_FIX),
        Some(Err(e)) if is_denied(&e) => Finding::new(
            "bpf_syscall",
            Status::Fail,
            format!(
                "bpf(2) is refused to root here ({e}): this process lacks the capabilities \
                 (effective: {}), as in a container without them",
                effective_capabilities().unwrap_or_else(|| "unknown".into())
            ),
        )
        .with_fix(
            "give the daemon CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and CAP_KILL (docker run \
             --privileged, or --cap-add for each; securityContext.privileged in Kubernetes; \
             CapabilityBoundingSet= in a systemd unit)",
        ),
        Some(Err(e)) => Finding::new("bpf_syscall", Status::Fail, format!("bpf(2) failed: {e}"))
            .with_fix("see the kernel log (dmesg) for why"),
    });

    // Without bpf(2) the probes fail, and what they say is not about the kernel: only BTF,
    // a file, is still told.
    let probes = bounded(BPF_TIMEOUT, support::probes).map(|probes| {
        probes
            .into_iter()
            .map(|mut probe| {
                if !bpf_usable && probe.name != "btf" {
                    probe.present = None;
                }
                probe
            })
            .collect::<Vec<_>>()
    });
    let Some(probes) = probes else {
        findings.push(timed_out("kernel_probes"));
        return findings;
    };
    for probe in probes {
        findings.push(match probe.present {
            Some(false) => {
                Finding::new(probe.name, Status::Fail, format!("missing: {}", probe.what)).with_fix(
                    format!(
                        "boot a kernel of Linux {} or later built with CONFIG_BPF_SYSCALL=y and \
                     CONFIG_DEBUG_INFO_BTF=y (every major distribution's current kernel is)",
                        support::KERNEL_FLOOR
                    ),
                )
            }
            // aya's probe of the program type cannot tell on kernels that refuse tracing
            // programs without a target (EPERM): attaching one to its target does.
            _ if probe.name == "tp_btf" && bpf_usable => tp_btf(probe.what),
            None => not_checked(probe.name, bpf_usable, root),
            Some(true) => Finding::ok(probe.name, short(probe.what)),
        });
    }
    findings
}

/// A probe that needs bpf(2), which this process may not use, or that could not tell.
fn not_checked(name: &'static str, bpf_usable: bool, root: bool) -> Finding {
    if bpf_usable {
        Finding::new(
            name,
            Status::Warn,
            "the probe could not tell (see bpf_syscall)",
        )
    } else if root {
        Finding::new(
            name,
            Status::NeedsRoot,
            "not checked: bpf(2) is refused to this process",
        )
        .with_fix("give this process the capabilities bpf_syscall names, then run it again")
    } else {
        Finding::new(
            name,
            Status::NeedsRoot,
            "needs root to check (it loads a BPF program)",
        )
        .with_fix(NEEDS_ROOT_FIX)
    }
}

/// tp_btf is there: load and attach a program as the fork program is (then close both).
fn tp_btf(what: &'static str) -> Finding {
    match bounded(BPF_TIMEOUT, || {
        support::tp_btf_attach().map_err(|e| format!("{e:#}"))
    }) {
        None => timed_out("tp_btf"),
        Some(Ok(())) => Finding::ok(
            "tp_btf",
            format!(
                "{}; a program attached to sched_process_fork, then detached",
                short(what)
            ),
        ),
        Some(Err(e)) => Finding::new(
            "tp_btf",
            Status::Fail,
            format!("the kernel has tp_btf, but {e}"),
        )
        .with_fix(
            "the kernel refuses the programs' kind: look at dmesg, and at a security module \
                 (SELinux, lockdown) that may refuse BPF",
        ),
    }
}

/// A requirement's description up to its first comma: what it is and the Linux that brought it.
fn short(what: &str) -> String {
    let upto = what.find("), ").map_or(what.len(), |i| i + 1);
    what[..upto].to_owned()
}

fn is_denied(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EPERM | libc::EACCES))
}

/// CapEff of this process, in hex.
fn effective_capabilities() -> Option<String> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .map(|caps| caps.trim().to_owned())
}

/// bpffs at /sys/fs/bpf (as /proc/self/mountinfo says), and its mode.
fn bpffs() -> Finding {
    const NAME: &str = "bpffs";
    let mountinfo = match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => text,
        Err(e) => {
            return Finding::new(
                NAME,
                Status::Warn,
                format!("reading /proc/self/mountinfo: {e}"),
            );
        }
    };
    let mounted = mountinfo.lines().any(|line| {
        let Some((mount, filesystem)) = line.split_once(" - ") else {
            return false;
        };
        mount.split(' ').nth(4) == Some(BPFFS) && filesystem.split(' ').next() == Some("bpf")
    });
    if !mounted {
        return Finding::new(
            NAME,
            Status::Fail,
            format!(
                "no BPF file system is mounted at {BPFFS}: the daemon pins its programs and \
                 maps there, so that tracking goes on while it is away"
            ),
        )
        .with_fix(format!(
            "mount -t bpf -o mode=0700 bpf {BPFFS} (as root; the daemon mounts it itself if it \
             may, and `leash daemon --no-pin` needs none, but then tracking ends with the daemon)"
        ));
    }
    let meta = match fs::metadata(BPFFS) {
        Ok(meta) => meta,
        Err(e) => return Finding::new(NAME, Status::Warn, format!("mounted, but {BPFFS}: {e}")),
    };
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 {
        Finding::new(
            NAME,
            Status::Fail,
            format!(
                "mounted at {BPFFS}, but owned by uid {} (mode {mode:04o}): the daemon trusts \
                 only root's directories for its pins",
                meta.uid()
            ),
        )
        .with_fix(format!("chown root {BPFFS} && chmod 0700 {BPFFS}"))
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        Finding::new(
            NAME,
            Status::Fail,
            format!(
                "mounted at {BPFFS}, mode {mode:04o}: others may write it, and replace the pins"
            ),
        )
        .with_fix(format!("chmod 0700 {BPFFS}"))
    } else if mode & 0o022 != 0 {
        Finding::new(
            NAME,
            Status::Warn,
            format!(
                "mounted at {BPFFS}, mode {mode:04o}: any user may make the pin directory \
                 before the daemon does, and the daemon then refuses to use it"
            ),
        )
        .with_fix(format!("chmod 0700 {BPFFS}"))
    } else {
        Finding::ok(NAME, format!("mounted at {BPFFS}, mode {mode:04o}, root's"))
    }
}

/// The socket's directory, checked as the daemon checks it before it binds (trusted_dir).
fn socket_dir(socket: &Path) -> Finding {
    const NAME: &str = "socket_dir";
    let dir = socket
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Err(e) = leash::trusted_dir::check_existing(dir, "--socket") {
        let denied = e
            .chain()
            .filter_map(|cause| cause.downcast_ref::<io::Error>())
            .any(|e| e.kind() == ErrorKind::PermissionDenied);
        if denied {
            return Finding::new(
                NAME,
                Status::NeedsRoot,
                format!("needs root to check {}: {e:#}", dir.display()),
            )
            .with_fix(NEEDS_ROOT_FIX);
        }
        // The error ends with its fix ("...; fix: chown root DIR && chmod go-w DIR, or choose
        // another --socket"): they go apart.
        let message = format!("{e:#}");
        return match message.split_once("; fix: ") {
            Some((what, fix)) => Finding::new(NAME, Status::Fail, what).with_fix(fix),
            None => Finding::new(NAME, Status::Fail, message)
                .with_fix("choose another --socket, in a directory of root's alone"),
        };
    }
    let d = dir.display();
    match fs::metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => Finding::ok(
            NAME,
            format!(
                "{d} does not exist yet; the daemon makes it (0755), and what is above it is root's alone"
            ),
        ),
        Err(e) => Finding::new(NAME, Status::Warn, format!("{d}: {e}")),
        Ok(meta) if meta.mode() & 0o001 == 0 => Finding::new(
            NAME,
            Status::Warn,
            format!(
                "{d} (mode {:04o}) is root's alone, but other users cannot reach the socket in it",
                meta.mode() & 0o7777
            ),
        )
        .with_fix(format!(
            "chmod 0755 {d}, if other users' hosts should use leash"
        )),
        Ok(meta) => Finding::ok(
            NAME,
            format!(
                "{d}: root's, mode {:04o}, as the daemon requires",
                meta.mode() & 0o7777
            ),
        ),
    }
}

/// The caller's pid namespace, and whether the daemon and this process see each other.
fn pid_namespace(daemon: Option<&DaemonReply>) -> Finding {
    const NAME: &str = "pid_namespace";
    let own = match leash::proc::own_pid_namespace() {
        Ok(own) => own,
        Err(e) => return Finding::new(NAME, Status::Warn, format!("cannot tell: {e}")),
    };
    let daemon_pid = daemon.map(|d| d.peer_pid);
    if own == INITIAL_PID_NAMESPACE {
        return Finding::ok(NAME, "the host's: pids here are the daemon's");
    }
    match daemon_pid {
        Some(0) => Finding::new(
            NAME,
            Status::Warn,
            "a pid namespace of its own (a container without the host's pid namespace), in \
             which the daemon has no number: the daemon reports pids as this namespace numbers \
             them, shows processes outside it as pid 0, and `leash adopt PID` takes a pid of \
             this namespace",
        )
        .with_fix(
            "nothing to fix for hosts in the container; to see the host's pids, run it with \
             the host's pid namespace (docker run --pid=host; hostPID: true in Kubernetes)",
        ),
        Some(pid) => {
            let depth = |pid: u32| leash::proc::namespace_pids(pid).map(|n| n.len());
            match (depth(std::process::id()), depth(pid as u32)) {
                (Some(ours), Some(its)) if its > ours => Finding::new(
                    NAME,
                    Status::Fail,
                    format!(
                        "the daemon (pid {pid}) runs in a pid namespace nested in this one: it \
                         cannot see this process, and refuses what it asks"
                    ),
                )
                .with_fix(
                    "run the daemon in the host's pid namespace (docker run --pid=host; \
                     hostPID: true in Kubernetes), or the hosts in the daemon's",
                ),
                _ => Finding::ok(
                    NAME,
                    format!(
                        "not the host's, but the daemon's (pid {pid} here): they see each other"
                    ),
                ),
            }
        }
        None => Finding::new(
            NAME,
            Status::Warn,
            "a pid namespace of its own, not the host's (a container?): a daemon outside it \
             reports pids as this namespace numbers them, and processes outside it as pid 0",
        )
        .with_fix(
            "nothing to fix for hosts in the container; to see the host's pids, run it with \
             the host's pid namespace (docker run --pid=host; hostPID: true in Kubernetes)",
        ),
    }
}

/// What the daemon said, and who it is.
struct DaemonReply {
    status: StatusInfo,
    /// The daemon's pid as this process's namespace numbers it: 0 outside it.
    peer_pid: i32,
}

enum DaemonError {
    Connect(io::Error),
    /// It took the connection, and did not answer in time.
    Silent,
    Closed,
    Refused(String),
    Protocol(String),
}

/// `hello` and `status` on a connection of its own, each reply waited for [`TIMEOUT`] at most.
fn ask_daemon(socket: &Path) -> Result<DaemonReply, DaemonError> {
    let mut client = Client::connect_with_timeout(socket, Some(TIMEOUT)).map_err(|e| match e {
        ClientError::Connect { error, .. } => DaemonError::Connect(error),
        e => DaemonError::from(e),
    })?;
    let peer_pid = leash::sys::peer_pid(client.as_fd()).unwrap_or(-1);
    let status = client.status()?;
    Ok(DaemonReply { status, peer_pid })
}

impl From<ClientError> for DaemonError {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Io(e)
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                Self::Silent
            }
            ClientError::Io(e) if e.kind() == ErrorKind::UnexpectedEof => Self::Closed,
            ClientError::Daemon { code, message } => Self::Refused(format!("{message} ({code})")),
            e => Self::Protocol(e.to_string()),
        }
    }
}

/// The daemon: reached, and of which version.
fn daemon_finding(socket: &Path, daemon: &Result<DaemonReply, DaemonError>) -> Finding {
    const NAME: &str = "daemon";
    let s = socket.display();
    let on_socket = if socket == Path::new(DEFAULT_SOCKET) {
        String::new()
    } else {
        format!(" --socket {s}")
    };
    let start = format!(
        "start it: systemctl start leash (or, as root: leash daemon{on_socket}); if it listens \
         on another socket, name that one: leash --socket PATH doctor, or LEASH_SOCKET=PATH"
    );
    match daemon {
        Ok(reply) => {
            let status = &reply.status;
            let ours = env!("CARGO_PKG_VERSION");
            if status.daemon_version != ours || status.protocol != PROTOCOL_VERSION {
                Finding::new(
                    NAME,
                    Status::Warn,
                    format!(
                        "leash daemon {} (protocol {}) answers at {s}, but this leash is {ours} \
                         (protocol {PROTOCOL_VERSION})",
                        status.daemon_version, status.protocol
                    ),
                )
                .with_fix(
                    "run one release: install the same leash for the daemon and the clients, \
                     then hand the daemon over to the new binary (systemctl kill \
                     --kill-whom=main --signal=HUP leash; see docs/DEPLOY.md)",
                )
            } else {
                Finding::ok(
                    NAME,
                    format!(
                        "leash daemon {} (protocol {}) answers at {s}: the same version as this leash",
                        status.daemon_version, status.protocol
                    ),
                )
            }
        }
        Err(DaemonError::Connect(e)) if e.kind() == ErrorKind::NotFound => {
            let dir_missing = socket.parent().is_some_and(|dir| !dir.exists());
            Finding::new(
                NAME,
                Status::Fail,
                format!(
                    "no daemon: nothing at {s}{}",
                    if dir_missing {
                        " (its directory does not exist either)"
                    } else {
                        ""
                    }
                ),
            )
            .with_fix(start)
        }
        Err(DaemonError::Connect(e)) if e.kind() == ErrorKind::ConnectionRefused => Finding::new(
            NAME,
            Status::Fail,
            format!("no daemon: {s} is left by a daemon that is gone, and nothing listens on it"),
        )
        .with_fix(start),
        Err(DaemonError::Connect(e)) if e.kind() == ErrorKind::PermissionDenied => Finding::new(
            NAME,
            Status::Fail,
            format!("this user may not connect to {s}: {e}"),
        )
        .with_fix(format!(
            "the daemon's socket is for every user (0666): make its directory reachable \
             (chmod 0755 {}), or run as root",
            socket.parent().unwrap_or(Path::new("/")).display()
        )),
        Err(DaemonError::Connect(e)) => {
            Finding::new(NAME, Status::Fail, format!("connecting to {s}: {e}")).with_fix(start)
        }
        Err(DaemonError::Silent) => Finding::new(
            NAME,
            Status::Fail,
            format!(
                "whatever listens at {s} took the connection but did not answer within {} s",
                TIMEOUT.as_secs()
            ),
        )
        .with_fix(
            "the daemon may be stuck, or this is not its socket: look at its log \
             (journalctl -u leash), then restart it (systemctl restart leash)",
        ),
        Err(DaemonError::Closed) => Finding::new(
            NAME,
            Status::Fail,
            format!("whatever listens at {s} closed the connection without answering"),
        )
        .with_fix("look at the daemon's log (journalctl -u leash): it may be refusing connections (too many for this uid?)"),
        Err(DaemonError::Refused(message)) => Finding::new(
            NAME,
            Status::Fail,
            format!("the daemon at {s} refused: {message}"),
        )
        .with_fix(
            "run one release of leash for the daemon and its clients (see docs/DEPLOY.md)",
        ),
        Err(DaemonError::Protocol(message)) => Finding::new(
            NAME,
            Status::Fail,
            format!("what answers at {s} does not speak leash's protocol: {message}"),
        )
        .with_fix("name the leash daemon's socket: leash --socket PATH doctor, or LEASH_SOCKET=PATH"),
    }
}

/// The pins: where the daemon says it pinned (or, without a daemon, the default pin
/// directory), complete, of this leash's ABI, and no other ABI's beside them.
fn pins(pinned_at: Option<Option<String>>, pin_dir: &Path, root: bool) -> Finding {
    const NAME: &str = "pins";
    let (dir, daemon_up) = match pinned_at {
        Some(None) => {
            return Finding::new(
                NAME,
                Status::Warn,
                "the daemon does not pin (--no-pin): if it dies, tracking ends with it, and no \
                 daemon can take its trees over",
            )
            .with_fix(format!("run the daemon without --no-pin (pins go to --pin-dir, {DEFAULT_PIN_DIR} by default)"));
        }
        Some(Some(dir)) => (PathBuf::from(dir), true),
        None => (pin_dir.join(format!("v{ABI_VERSION}")), false),
    };
    let root_dir = dir.parent().unwrap_or(Path::new("/")).to_owned();
    // Whether the pins can be looked at: bpffs is usually root's alone.
    if let Err(e) = fs::read_dir(&root_dir)
        && e.kind() == ErrorKind::PermissionDenied
    {
        if root {
            return Finding::new(
                NAME,
                Status::Fail,
                format!("root may not read {}: {e}", root_dir.display()),
            )
            .with_fix("look for a security module (SELinux, AppArmor) that denies it");
        }
        return Finding::new(
            NAME,
            Status::NeedsRoot,
            format!(
                "needs root to look at the pins in {} (root's alone)",
                root_dir.display()
            ),
        )
        .with_fix(NEEDS_ROOT_FIX);
    }
    let pins = Pins::existing(&root_dir);
    let others = pins.other_versions();
    let others_text = others
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let d = dir.display();
    if daemon_up {
        if !dir.ends_with(format!("v{ABI_VERSION}")) {
            return Finding::new(
                NAME,
                Status::Warn,
                format!("the daemon pins at {d}, not of this leash's ABI (v{ABI_VERSION}): it is another release"),
            )
            .with_fix("run one release of leash for the daemon and its clients (see docs/DEPLOY.md)");
        }
        let missing = pins.missing();
        if !missing.is_empty() {
            return Finding::new(
                NAME,
                Status::Fail,
                format!(
                    "the daemon pins at {d}, but {} of its pins are missing ({}): a daemon \
                     that takes over from it will not find them",
                    missing.len(),
                    missing[0].display()
                ),
            )
            .with_fix("restart the daemon (systemctl restart leash: it kills every tree) to pin them again");
        }
    } else if pins.exist() {
        return Finding::new(
            NAME,
            Status::Warn,
            format!(
                "pins at {d} with no daemon answering: the programs go on tracking every tree, \
                 but nothing kills a tree until a daemon takes them over"
            ),
        )
        .with_fix("start the daemon (systemctl start leash, or leash daemon): it takes them over");
    }
    if !others.is_empty() {
        return Finding::new(
            NAME,
            Status::Warn,
            format!(
                "pins of another leash release beside these (ABI v{ABI_VERSION}): {others_text}; \
                 their programs follow their trees, but no daemon of this release enforces them"
            ),
        )
        .with_fix(format!(
            "stop the daemon of that release (its trees are killed), or once its trees are \
             gone, remove them: rm -r {others_text}"
        ));
    }
    if daemon_up {
        Finding::ok(
            NAME,
            format!("{d}: every link and map pinned, ABI v{ABI_VERSION}"),
        )
    } else {
        Finding::ok(NAME, format!("none left at {d} (ABI v{ABI_VERSION})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_a_line_a_check_and_the_fix_under_a_failure() {
        let report = Report {
            verdict: Status::Fail,
            version: "0.1.0",
            daemon_version: None,
            socket: DEFAULT_SOCKET.into(),
            findings: vec![
                Finding::ok("kernel", "Linux 6.1").with_fix("never shown"),
                Finding::new("daemon", Status::Fail, "no daemon").with_fix("start it"),
                Finding::new("pins", Status::NeedsRoot, "needs root").with_fix(NEEDS_ROOT_FIX),
            ],
        };
        let text = text(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ok     kernel "), "{text}");
        assert!(lines[1].starts_with("FAIL   daemon "), "{text}");
        assert_eq!(lines[2].trim(), "fix: start it", "{text}");
        assert!(lines[3].starts_with("ROOT?  pins "), "{text}");
        assert!(!text.contains("never shown"), "{text}");
        assert!(text.contains("marked ROOT? need root"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["findings"][2]["status"], "needs_root");
        assert!(json["findings"][0].get("fix").is_some());
    }

    #[test]
    fn a_requirement_is_shortened_to_what_and_when() {
        assert_eq!(
            short("BPF ring buffers (Linux 5.8), which carry the events"),
            "BPF ring buffers (Linux 5.8)"
        );
        assert_eq!(short("no comma"), "no comma");
    }
}
