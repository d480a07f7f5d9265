//! `leash doctor`: whether the daemon can run on this machine and whether this process reaches
//! it; for each problem, what is wrong and the command or setting that fixes it. The JSON shape
//! is in docs/JSON.md.
//!
//! Every check is bounded in time (a daemon that takes the connection and never answers must
//! not hang the doctor), and the probes that load BPF leave nothing behind: they pin nothing,
//! and close what they loaded and attached.
//!
//! - [`kernel`]: the kernel's version, BTF, lockdown, bpf(2), and the programs' requirements;
//! - [`files`]: bpffs, the socket's directory and the pins;
//! - [`daemon`]: the daemon's answer, and whether it and this process see each other's pids;
//! - [`guard`]: the ptrace guard the daemon has in place;
//! - [`tiocsti`]: whether an agent sharing its user's terminal can type into it;
//! - [`report`]: the findings, the verdict, and the text (JSON is their serialization);
//! - [`bounds`]: every check on a thread of its own, waited for a bounded time.

mod bounds;
mod daemon;
mod files;
mod guard;
mod kernel;
mod report;
mod tiocsti;

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Result;
use clap::Args;

use bounds::{TIMEOUT, bounded, is_root, timed_out};
use daemon::{DaemonError, ask_daemon, daemon_finding, pid_namespace};
use files::{DEFAULT_PIN_DIR, bpffs, pins, socket_dir};
pub(super) use guard::guard_of;
use guard::ptrace_guard_finding;
use kernel::{kernel_findings, membership_finding};
use report::{Report, Status, text};
use tiocsti::legacy_tiocsti_finding;

#[derive(Args, Debug)]
pub(super) struct DoctorArgs {
    /// Print JSON (one document: the findings and a verdict) instead of text.
    #[arg(long)]
    json: bool,
    /// The daemon's pin directory, looked at when the daemon cannot be asked where it pins.
    #[arg(long, default_value = DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
}

pub(super) fn doctor(socket: &Path, args: DoctorArgs) -> Result<ExitCode> {
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
    let membership = daemon
        .as_ref()
        .ok()
        .and_then(|d| d.status.membership.clone());
    findings.push(membership_finding(membership.as_deref()));
    let programs = daemon.as_ref().ok().map(|d| d.status.programs.as_slice());
    findings.push(ptrace_guard_finding(programs));
    let pinned_at = daemon.as_ref().ok().map(|d| d.status.pinned_at.clone());
    findings.push(
        bounded(TIMEOUT, {
            let pin_dir = args.pin_dir.clone();
            move || pins(pinned_at, &pin_dir, root)
        })
        .unwrap_or_else(|| timed_out("pins")),
    );
    findings.extend(legacy_tiocsti_finding());

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
    let mut out = super::stdout::lock();
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
