//! `leash exec` and `leash adopt`, the shim: register a process under another host's lease,
//! whose token comes on a descriptor or in the environment, and tell that host the outcome on
//! a descriptor of its own.

use std::{
    fs::File,
    io::Write,
    os::{fd::AsFd, unix::process::CommandExt},
    path::Path,
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use leash_client::{LEASE_ENV, protocol::ExecReport, read_lease_token, sys};

use super::{EnforcementArgs, connect};
use crate::cli::exec_failure::ExecFailure;

// The token comes on a descriptor or in the environment, never on the command line (see the
// command's help in mod.rs).
#[derive(Args, Debug)]
pub(in crate::cli) struct ExecArgs {
    /// Read the host's lease token from file descriptor N (3 or above), a pipe or file the host
    /// passed: up to a newline or the end of it (at most 256 bytes). N is closed before CMD
    /// runs, so CMD never holds it. The way to prefer: nothing CMD starts can see the token.
    /// Otherwise LEASH_LEASE holds the token: the shim wipes it from its own environment as it
    /// starts (where /proc/PID/environ shows it), and CMD never gets it.
    #[arg(long, value_name = "N")]
    lease_fd: Option<i32>,
    /// Report the outcome to the host on file descriptor M (3 or above; the same as N when
    /// that is a socket), one JSON line: {"registered":{"tree":T,"root":PID}} before CMD runs,
    /// or {"error":{"code":C,"message":M}} if the command was not registered (CMD never runs;
    /// nothing is written to stderr), then {"exec_failed":{"errno":E,"message":M}} if CMD
    /// could not be executed (M as a shell says it: `agent: command not found`; the shim exits
    /// 127 or 126). M is closed as CMD starts: end of file after "registered" means
    /// CMD runs. `code` is the daemon's error code, `unavailable` (no daemon) or `failed`.
    #[arg(long, value_name = "M")]
    status_fd: Option<i32>,
    /// CMD's argv[0], if not CMD itself (CMD is still the program executed).
    #[arg(long, value_name = "NAME")]
    argv0: Option<String>,
    #[command(flatten)]
    enforcement: EnforcementArgs,
    /// The command to exec once registered: after `--`, or as it is (the options of `leash
    /// exec` come before it).
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub(in crate::cli) struct AdoptArgs {
    /// Read the host's lease token from file descriptor N, as `leash exec --lease-fd` does
    /// (or from LEASH_LEASE, as it does).
    #[arg(long, value_name = "N")]
    lease_fd: Option<i32>,
    /// Report the outcome on file descriptor M, one JSON line, as `leash exec --status-fd`
    /// does: {"registered":{"tree":T,"root":PID}} or {"error":{"code":C,"message":M}}.
    /// Without it, the tree's id is printed.
    #[arg(long, value_name = "M")]
    status_fd: Option<i32>,
    #[command(flatten)]
    enforcement: EnforcementArgs,
    /// The process, by its number in this command's pid namespace.
    #[arg(value_name = "PID")]
    pid: u32,
}

pub(in crate::cli) fn exec(socket: &Path, args: ExecArgs) -> Result<ExitCode> {
    // First of all: wiped where /proc/PID/environ shows it, so that no process of the same
    // user reads the token there while this one registers (the command never gets it).
    let from_env = leash::sys::take_env_secret(LEASE_ENV);
    // Then, before this process opens anything that could take the number of a descriptor
    // that was not inherited after all.
    let mut status = args
        .status_fd
        .map(|fd| ExecStatus::take(fd, args.lease_fd))
        .transpose()?;
    let registered = lease_token(args.lease_fd, from_env).and_then(|token| {
        let mut client = connect(socket)?;
        // Itself, as the connection names it: right in a container's pid namespace too.
        let tree = client.register_self(&token, &args.enforcement.options())?;
        // This connection's own lease holds nothing; closing it changes nothing.
        drop(client);
        Ok(tree)
    });
    let tree = match (registered, &mut status) {
        (Ok(tree), _) => tree,
        (Err(error), None) => return Err(error),
        (Err(error), Some(status)) => {
            status.refused(&error);
            return Ok(ExitCode::from(crate::cli::HOST_FAILURE));
        }
    };
    if let Some(status) = &mut status {
        status.registered(tree);
    }
    let (program, rest) = args.command.split_first().context("no command")?;
    let mut command = Command::new(program);
    command.args(rest).env_remove(LEASE_ENV);
    if let Some(argv0) = &args.argv0 {
        command.arg0(argv0);
    }
    let error = command.exec();
    let failure = ExecFailure::of_exec(program, &error);
    match &mut status {
        Some(status) => status.exec_failed(error.raw_os_error(), failure.message),
        None => eprintln!("leash: {}", failure.message),
    }
    Ok(ExitCode::from(failure.status))
}

pub(in crate::cli) fn adopt(socket: &Path, args: AdoptArgs) -> Result<ExitCode> {
    // As exec does, and for the same reasons.
    let from_env = leash::sys::take_env_secret(LEASE_ENV);
    let mut status = args
        .status_fd
        .map(|fd| ExecStatus::take(fd, args.lease_fd))
        .transpose()?;
    let registered = lease_token(args.lease_fd, from_env)
        .and_then(|token| adopt_by_pidfd(socket, args.pid, &token, &args.enforcement));
    match (registered, &mut status) {
        (Ok(tree), Some(status)) => status.registered_as(args.pid, tree),
        (Ok(tree), None) => writeln!(crate::cli::stdout::lock(), "{tree}")?,
        (Err(error), None) => return Err(error),
        (Err(error), Some(status)) => {
            status.refused(&error);
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Registers process `pid` of this pid namespace under the lease of `token`, named by a pidfd:
/// right whatever namespace the daemon runs in, and never another process that later gets the
/// number. As `Client::adopt` does, a number that opens no pidfd goes to the daemon as it is,
/// for the daemon's own words (no such process, or a thread's id).
fn adopt_by_pidfd(
    socket: &Path,
    pid: u32,
    token: &str,
    enforcement: &EnforcementArgs,
) -> Result<u32> {
    let pidfd = sys::pidfd_open(pid);
    let mut client = connect(socket)?;
    let options = enforcement.options();
    let tree = match &pidfd {
        Ok(pidfd) => client.register_pidfd(pidfd.as_fd(), Some(token), &options)?,
        Err(_) => client.register(pid, Some(token), &options)?,
    };
    Ok(tree)
}

/// `leash exec --status-fd`: where the shim tells the host library what became of the command,
/// so that a refusal is an error at spawn time, in the daemon's words, and not a child that
/// exits 125. The descriptor is close-on-exec: it reads as closed once the command runs.
struct ExecStatus(File);

impl ExecStatus {
    /// Takes descriptor `fd`; a copy when it is also the lease descriptor, which is read and
    /// closed first (a socket serves both ways).
    fn take(fd: i32, lease_fd: Option<i32>) -> Result<Self> {
        let context = || format!("--status-fd {fd}");
        let owned = if lease_fd == Some(fd) {
            sys::duplicate_fd(fd).with_context(context)?
        } else {
            sys::take_inherited_fd(fd).with_context(context)?
        };
        sys::set_cloexec(&owned).with_context(context)?;
        Ok(Self(File::from(owned)))
    }

    fn registered(&mut self, tree: u32) {
        self.registered_as(std::process::id(), tree);
    }

    fn registered_as(&mut self, root: u32, tree: u32) {
        self.write(&ExecReport::Registered { root, tree });
    }

    fn refused(&mut self, error: &anyhow::Error) {
        let (code, message) = match error.downcast_ref::<leash_client::Error>() {
            Some(leash_client::Error::Daemon { code, message }) => {
                (code.to_string(), message.clone())
            }
            Some(leash_client::Error::Connect { .. }) => ("unavailable".into(), error.to_string()),
            _ => ("failed".into(), format!("{error:#}")),
        };
        self.write(&ExecReport::Refused { code, message });
    }

    fn exec_failed(&mut self, errno: Option<i32>, message: String) {
        self.write(&ExecReport::ExecFailed { errno, message });
    }

    /// A host that is gone cannot be told; its lease has ended and the tree dies with it.
    fn write(&mut self, report: &ExecReport) {
        let written = serde_json::to_string(report)
            .map_err(std::io::Error::from)
            .and_then(|line| writeln!(self.0, "{line}"));
        if let Err(error) = written {
            tracing::debug!("could not write the status line: {error}");
        }
    }
}

/// The lease token, from descriptor `fd` (closed once read) or from LEASH_LEASE (`from_env`):
/// exactly one.
fn lease_token(fd: Option<i32>, from_env: Option<std::ffi::OsString>) -> Result<String> {
    match (fd, from_env) {
        (Some(fd), None) => {
            let file =
                File::from(sys::take_inherited_fd(fd).with_context(|| format!("--lease-fd {fd}"))?);
            // `file` is dropped, and the descriptor closed, on return.
            read_lease_token(file).with_context(|| format!("reading the lease token from fd {fd}"))
        }
        (None, Some(token)) => {
            let token = token
                .into_string()
                .map_err(|_| anyhow!("{LEASE_ENV} is not UTF-8"))?;
            let token = token.trim();
            if token.is_empty() {
                bail!("{LEASE_ENV} is empty");
            }
            Ok(token.to_owned())
        }
        (Some(_), Some(_)) => bail!(
            "both --lease-fd and {LEASE_ENV} give a lease token: pass exactly one (unset \
             {LEASE_ENV}, or leave out --lease-fd)"
        ),
        (None, None) => bail!(
            "no lease token: pass it on a descriptor with --lease-fd N, or in {LEASE_ENV} \
             (never on the command line, where any local user can read it)"
        ),
    }
}
