//! The commands that act as a host of the daemon: `run`, `exec`, `kill`.

use std::{
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::{Context, Result, anyhow};
use clap::Args;
use leash_client::{Client, EventKind, RootExitPolicy, TreeOptions};

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

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The lease token of the host (from its `hello` reply).
    #[arg(long, env = "LEASH_LEASE", hide_env_values = true)]
    lease: String,
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
    let mut client = Client::connect_to(socket)?;
    client.register(
        std::process::id(),
        Some(&args.lease),
        &args.enforcement.options(),
    )?;
    // This connection's own lease holds nothing; closing it changes nothing.
    drop(client);
    let (program, rest) = args.command.split_first().context("no command")?;
    let error = Command::new(program).args(rest).exec();
    eprintln!(
        "leash: {:#}",
        anyhow!(error).context(format!("executing {program}"))
    );
    Ok(ExitCode::from(127))
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
