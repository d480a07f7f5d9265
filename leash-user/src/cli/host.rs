//! The commands that act as a host of the daemon: `run`, `exec`, `adopt`, `kill` (`exec` and
//! `adopt` in `shim`).

mod shim;

use std::{
    io::Write,
    os::fd::AsFd,
    path::Path,
    process::{Child, Command, ExitCode},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use leash::sys::{Pidfd, SignalFd, wait_readable};
use leash_client::{
    Client, ClosingReason, ErrorCode, EventKind, EventReason, RootExitPolicy, TreeOptions,
    protocol::{KillReason, PROTOCOL_VERSION},
};
pub(super) use shim::{AdoptArgs, ExecArgs, adopt, exec};

use super::{
    exec_failure::ExecFailure,
    pty::{self, Pty},
};

/// How a tree is enforced, as `run` and `exec` take it.
#[derive(Args, Debug)]
pub(super) struct EnforcementArgs {
    /// Time between SIGTERM and SIGKILL when the tree is killed: seconds (5, 0.5) or with a
    /// unit (500ms, 2s, 1m). The daemon's default if not given; 0 goes straight to SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse)]
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
pub(super) struct RunArgs {
    #[command(flatten)]
    enforcement: EnforcementArgs,
    /// Let CMD share this terminal. By default, when standard input is a terminal, CMD gets a
    /// pseudoterminal of its own, which leash relays to and from this one (as sudo's use_pty
    /// does): what CMD pushes into its terminal's input (ioctl TIOCSTI) reaches only that pty.
    /// With --no-pty, on a kernel that allows TIOCSTI (dev.tty.legacy_tiocsti = 1, and every
    /// kernel before 6.2), CMD can type commands into your shell, which runs them after leash
    /// run returns, outside any tree. Without a terminal on standard input, no pty is made.
    /// With a pty, CMD's exit hangs it up: with --keep-on-root-exit, what should outlive CMD
    /// ignores SIGHUP (nohup) or calls setsid.
    #[arg(long)]
    no_pty: bool,
    /// The command, the root of the tree: after `--`, or as it is (`leash run make -j4`; the
    /// options of `leash run` come before it, and what follows its name is its own).
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub(super) struct KillArgs {
    /// The tree's id.
    tree: u32,
    /// Time between SIGTERM and SIGKILL: seconds (5, 0.5) or with a unit (500ms, 2s, 1m).
    /// The tree's own if not given.
    #[arg(long, value_name = "DURATION", value_parser = super::duration::parse)]
    grace: Option<Duration>,
}

/// The signals `leash run` forwards to its tree as a kill: a container runtime's stop (SIGTERM
/// to the first process, which ignores it by default when it is pid 1), `timeout`'s, a
/// terminal's Ctrl-C (SIGINT) and hang-up (SIGHUP).
const FORWARDED: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
/// How often the wait for the end of the tree looks for a forwarded signal.
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

pub(super) fn run(socket: &Path, args: RunArgs) -> Result<ExitCode> {
    // First, before any thread starts, so that none takes them the default way (see
    // SignalFd::block).
    let signals = SignalFd::block(&FORWARDED).context("taking SIGTERM, SIGINT and SIGHUP")?;
    // Before any thread too (it takes SIGWINCH from a signalfd).
    let pty = if !args.no_pty && pty::wanted() {
        Some(Pty::open()?)
    } else {
        None
    };
    let mut client = connect(socket)?;
    // Before the spawn, so the end of the tree cannot be missed.
    client.subscribe()?;
    let (program, rest) = args.command.split_first().context("no command")?;
    let mut command = Command::new(program);
    command.args(rest);
    signals.unblock_in(&mut command);
    if let Some(pty) = &pty {
        pty.attach(&mut command)?;
    }
    let spawned = client.spawn(&mut command, &args.enforcement.options());
    // With its copies of the pty: the pty ends when the last process of the tree holding it
    // exits, and not with this one.
    drop(command);
    let (tree, mut child) = match spawned {
        Ok(spawned) => spawned,
        // The command's failure, not leash's: said and numbered as a shell does.
        Err(leash_client::Error::Spawn(error)) => match ExecFailure::of_spawn(program, &error) {
            Some(failure) => {
                eprintln!("leash: {}", failure.message);
                return Ok(ExitCode::from(failure.status));
            }
            None => return Err(leash_client::Error::Spawn(error).into()),
        },
        Err(error) => return Err(error.into()),
    };
    tracing::debug!(tree, pid = child.id(), "running on a leash");
    // Dropped on every way out of this function: the terminal gets its mode back.
    let mut relay = pty.map(|pty| pty.relay(&child));
    let root = Pidfd::open(child.id()).context("watching the command")?;
    let status = loop {
        let ready =
            wait_readable(&[signals.as_fd(), root.as_fd()]).context("waiting for the command")?;
        if let Some(signal) = signals.take().context("reading a signal")? {
            return Ok(forward(&mut client, tree, &mut child, signal));
        }
        if ready == 1 {
            break child.wait().context("waiting for the command")?;
        }
    };
    // What the command left behind is killed (or, kept, runs out) before we exit: leaving
    // would end the lease and kill it anyway.
    let mut kill = KillSeen::default();
    loop {
        if let Some(signal) = signals.take().context("reading a signal")? {
            return Ok(forward(&mut client, tree, &mut child, signal));
        }
        match client.next_event(Some(SIGNAL_CHECK)) {
            Ok(Some(event)) => {
                kill.note(tree, &event);
                if event.tree == tree
                    && matches!(event.kind, EventKind::TreeEmpty | EventKind::Released)
                {
                    break;
                }
            }
            Ok(None) => {}
            // A line this leash does not know (an event kind of a newer daemon): not the end
            // of the tree.
            Err(leash_client::Error::Protocol(e)) => {
                tracing::debug!("an event line not understood: {e}");
            }
            Err(e) => {
                if kill.reason.is_none() {
                    tracing::warn!("lost the daemon while waiting for the tree to end: {e}");
                }
                break;
            }
        }
    }
    // The tree's last output, before anything leash says, and in the terminal's own mode.
    if let Some(relay) = &mut relay {
        relay.finish();
    }
    // A tree killed from outside ends the command by a signal: say who ended it, or the
    // status (143) reads like the command's own crash.
    if let Some(why) = kill.outside_reason() {
        eprintln!("leash: tree {tree} was killed ({why})");
    }
    Ok(super::exit_code(status))
}

/// What `leash run` learned of a kill of its tree from the events.
#[derive(Debug, Default)]
struct KillSeen {
    /// The kill's reason (`request`, `shutdown`, ...), or a word this leash does not know;
    /// `shutdown` too when the daemon said it is closing the connection to stop.
    reason: Option<EventReason>,
}

impl KillSeen {
    fn note(&mut self, tree: u32, event: &leash_client::Event) {
        match event.kind {
            EventKind::KillStarted if event.tree == tree => {
                self.reason.clone_from(&event.reason);
            }
            EventKind::TreeEmpty if event.tree == tree => {
                if let Some(kill) = &event.kill {
                    self.reason = Some(EventReason::Kill(kill.reason));
                }
            }
            // The daemon's last line before it closes the connection to stop (docs/PROTOCOL.md,
            // `closing`): the tree dies with it unless it was handed over.
            EventKind::Closing if event.closing_reason() == Some(ClosingReason::Shutdown) => {
                self.reason
                    .get_or_insert(EventReason::Kill(KillReason::Shutdown));
            }
            _ => {}
        }
    }

    /// Why the tree was killed, in words, if not because its root exited (the end of every
    /// `leash run` whose command exits, not news).
    fn outside_reason(&self) -> Option<String> {
        let why = match self.reason.as_ref()? {
            EventReason::Kill(KillReason::RootExited) => return None,
            EventReason::Kill(KillReason::Request) => {
                "a kill was requested: leash kill, K in leash watch, or a host's kill"
            }
            EventReason::Kill(KillReason::Shutdown) => "the daemon shut down",
            EventReason::Kill(KillReason::EnclosingKilled) => "the tree it is nested in was killed",
            EventReason::Kill(KillReason::MemberQuota) => "it forked past its owner's member quota",
            EventReason::Kill(KillReason::Untrackable) => {
                "a child could not be tracked: the member map was full"
            }
            EventReason::Kill(KillReason::Resumed) => "a kill the previous daemon had begun",
            EventReason::Kill(KillReason::LeaseEnded) => "its lease ended",
            // A newer daemon's word, said as it is.
            other => other.as_str(),
        };
        Some(why.to_owned())
    }
}

/// Signal `signal` came: kills the tree (its grace, then SIGKILL) and, once it is empty, exits
/// 128+N, as a shell reports a command that signal ended. `leash run` stands for its tree: a
/// stop that returned before the tree was gone would leave it running unseen for the grace.
fn forward(client: &mut Client, tree: u32, child: &mut Child, signal: i32) -> ExitCode {
    tracing::debug!(tree, signal, "signal: killing the tree");
    let emptied = match client.kill(tree, None) {
        Ok(summary) => {
            tracing::debug!(
                tree = summary.tree,
                terminated = summary.terminated,
                killed = summary.killed,
                rounds = summary.rounds,
                elapsed_ms = summary.elapsed_ms,
                "the tree is empty"
            );
            true
        }
        // It ended on its own meanwhile.
        Err(leash_client::Error::Daemon {
            code: ErrorCode::NotFound,
            ..
        }) => true,
        // Exiting ends the lease, and the daemon (or, while it is away, the next one) kills
        // the tree all the same: do not wait for a command that may still run.
        Err(e) => {
            tracing::warn!("killing the tree on signal {signal}: {e}");
            false
        }
    };
    if emptied {
        // The root was in the tree: it has exited, and is reaped here.
        let _ = child.wait();
    }
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(u8::MAX))
}

/// Connects to the daemon. A refusal of this leash's protocol names both sides: this leash's
/// version, protocol and path, and the daemon's words (its protocol, and its version when it
/// says it). A binary packaged with a host library comes ahead of PATH, and may meet a system
/// daemon of another release; the host library reports this message as the spawn's error.
fn connect(socket: &Path) -> Result<Client, leash_client::Error> {
    Client::connect_to(socket).map_err(|error| match error {
        leash_client::Error::Daemon {
            code: ErrorCode::UnsupportedVersion,
            message,
        } => leash_client::Error::Daemon {
            code: ErrorCode::UnsupportedVersion,
            message: version_mismatch(socket, &message),
        },
        other => other,
    })
}

fn version_mismatch(socket: &Path, daemon_said: &str) -> String {
    let this = std::env::current_exe()
        .map(|path| format!(", {}", path.display()))
        .unwrap_or_default();
    format!(
        "this leash ({version}{this}) speaks protocol {PROTOCOL_VERSION}; the daemon at {socket} \
         said: {daemon_said}. Spawn through the leash binary of the daemon's release (LEASH_BIN, \
         or the host library's `leash` option), or install the host library of that release",
        version = env!("CARGO_PKG_VERSION"),
        socket = socket.display(),
    )
}

pub(super) fn kill(socket: &Path, args: KillArgs) -> Result<ExitCode> {
    let mut client = connect(socket)?;
    let summary = match client.kill(args.tree, args.grace) {
        Ok(summary) => summary,
        // The daemon's words alone (`no tree 23946; process 23946 is a member of tree 37:
        // leash kill 37`): they name what to do.
        Err(leash_client::Error::Daemon {
            code: ErrorCode::NotFound,
            message,
        }) => bail!("{message}"),
        Err(error) => return Err(error.into()),
    };
    writeln!(
        super::stdout::lock(),
        "tree {}: {}",
        summary.tree,
        super::counts::kill(&summary)
    )?;
    Ok(ExitCode::SUCCESS)
}
