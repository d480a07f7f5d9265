//! The commands that act as a host of the daemon: `run`, `exec`, `kill`.

use std::{
    fs::File,
    io::Write,
    os::{fd::AsFd, unix::process::CommandExt},
    path::Path,
    process::{Child, Command, ExitCode},
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use leash::sys::{Pidfd, SignalFd, wait_readable};
use leash_client::{
    Client, ClosingReason, ErrorCode, EventKind, EventReason, LEASE_ENV, RootExitPolicy,
    TreeOptions,
    protocol::{ExecReport, KillReason, PROTOCOL_VERSION},
    read_lease_token, sys,
};

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

// The token comes on a descriptor or in the environment, never on the command line (see the
// command's help in mod.rs).
#[derive(Args, Debug)]
pub(super) struct ExecArgs {
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
pub(super) struct AdoptArgs {
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

pub(super) fn exec(socket: &Path, args: ExecArgs) -> Result<ExitCode> {
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
            return Ok(ExitCode::from(super::HOST_FAILURE));
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

pub(super) fn adopt(socket: &Path, args: AdoptArgs) -> Result<ExitCode> {
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
        (Ok(tree), None) => writeln!(super::stdout::lock(), "{tree}")?,
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
