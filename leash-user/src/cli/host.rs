//! The commands that act as a host of the daemon: `run`, `exec`, `kill`.

use std::{
    fs::File,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use leash_client::{
    Client, EventKind, LEASE_ENV, RootExitPolicy, TreeOptions, read_lease_token, sys,
};

/// How a tree is enforced, as `run` and `exec` take it.
#[derive(Args, Debug)]
pub struct EnforcementArgs {
    /// Time between SIGTERM and SIGKILL when the tree is killed (the daemon's default if not
    /// given; 0 goes straight to SIGKILL).
    #[arg(long, value_parser = super::duration::parse)]
    grace: Option<Duration>,
    /// When the root exits, leave the rest of the tree running (it is still killed if the
    /// host dies).
    #[arg(long)]
    keep_on_root_exit: bool,
}

impl EnforcementArgs {
    fn options(&self) -> TreeOptions {
        TreeOptions {
            on_root_exit: if self.keep_on_root_exit {
                RootExitPolicy::Keep
            } else {
                RootExitPolicy::Kill
            },
            grace: self.grace,
        }
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    enforcement: EnforcementArgs,
    /// The command, the root of the tree.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

// The token comes on a descriptor or in the environment, never on the command line (see the
// command's help in mod.rs).
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Read the host's lease token from file descriptor N (3 or above), a pipe or file the host
    /// passed: up to a newline or the end of it (at most 256 bytes). N is closed before CMD
    /// runs, so CMD never holds it. The way to prefer: nothing CMD starts can see the token.
    /// Otherwise LEASH_LEASE holds the token; it is removed from CMD's environment (the shim's
    /// own environment is readable by the same user until it execs).
    #[arg(long, value_name = "N")]
    lease_fd: Option<i32>,
    #[command(flatten)]
    enforcement: EnforcementArgs,
    /// The command to exec once registered.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct KillArgs {
    /// The tree's id.
    tree: u32,
    /// Time between SIGTERM and SIGKILL (the tree's own if not given).
    #[arg(long, value_parser = super::duration::parse)]
    grace: Option<Duration>,
}

pub fn run(socket: &Path, args: RunArgs) -> Result<ExitCode> {
    let mut client = Client::connect_to(socket)?;
    // Before the spawn, so the end of the tree cannot be missed.
    client.subscribe()?;
    let (program, rest) = args.command.split_first().context("no command")?;
    let (tree, mut child) = client.spawn(
        Command::new(program).args(rest),
        &args.enforcement.options(),
    )?;
    tracing::debug!(tree, pid = child.id(), "running on a leash");
    let status = child.wait().context("waiting for the command")?;
    // What the command left behind is killed (or, kept, runs out) before we exit: leaving
    // would end the lease and kill it anyway.
    loop {
        match client.next_event(None) {
            Ok(Some(event))
                if event.tree == tree
                    && matches!(event.kind, EventKind::TreeEmpty | EventKind::Released) =>
            {
                break;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("lost the daemon while waiting for the tree to end: {e}");
                break;
            }
        }
    }
    Ok(super::exit_code(status))
}

pub fn exec(socket: &Path, args: ExecArgs) -> Result<ExitCode> {
    // First, before this process opens anything that could take the number of a descriptor
    // that was not inherited after all.
    let token = lease_token(args.lease_fd)?;
    let mut client = Client::connect_to(socket)?;
    client.register(
        std::process::id(),
        Some(&token),
        &args.enforcement.options(),
    )?;
    // This connection's own lease holds nothing; closing it changes nothing.
    drop(client);
    let (program, rest) = args.command.split_first().context("no command")?;
    let error = Command::new(program)
        .args(rest)
        .env_remove(LEASE_ENV)
        .exec();
    eprintln!(
        "leash: {:#}",
        anyhow!(error).context(format!("executing {program}"))
    );
    Ok(ExitCode::from(127))
}

/// The lease token, from descriptor `fd` (closed once read) or from LEASH_LEASE: exactly one.
fn lease_token(fd: Option<i32>) -> Result<String> {
    let from_env = std::env::var_os(LEASE_ENV);
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

pub fn kill(socket: &Path, args: KillArgs) -> Result<ExitCode> {
    let mut client = Client::connect_to(socket)?;
    let summary = client.kill(args.tree, args.grace)?;
    println!(
        "tree {} is empty: {} sent SIGTERM, {} SIGKILLs in {} rounds, {} ms",
        summary.tree, summary.terminated, summary.killed, summary.rounds, summary.elapsed_ms
    );
    Ok(ExitCode::SUCCESS)
}
