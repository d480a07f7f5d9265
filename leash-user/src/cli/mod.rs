//! Command-line interface: clap commands over the library.

// Standard output goes through `stdout`, which ends a command quietly when its reader is gone;
// `println!` would panic there instead.
#![deny(clippy::print_stdout)]

mod counts;
mod daemon;
mod doctor;
mod duration;
mod event_words;
mod exec_failure;
mod generate;
mod host;
mod logging;
mod pty;
mod show;
mod stdout;
mod timestamp;
mod track;
mod view;
mod watch;

use std::{
    os::unix::process::ExitStatusExt,
    path::PathBuf,
    process::{ExitCode, ExitStatus},
};

use clap::{Parser, Subcommand};
use leash::kernel::{PinsHeld, support::Unsupported};
use leash_client::protocol::{DEFAULT_SOCKET, SOCKET_ENV};

/// Keeps AI coding agents and everything they start on a leash. An eBPF program follows every
/// descendant of a registered process in the kernel as it forks, so setsid, double forks and
/// reparenting do not let a process escape its tree; the daemon kills the whole tree when its
/// root or the host that registered it dies.
///
/// `leash daemon` is the service (root). `leash run -- CMD` runs CMD on a leash (any user).
/// Logs go to stderr (to the journal, with fields, when stderr is the journal: under
/// systemd); LEASH_LOG=debug shows more, LEASH_LOG_FORMAT=text|journald picks the form.
#[derive(Parser, Debug)]
#[command(name = "leash", version = generate::VERSION, about, long_about)]
struct Cli {
    /// The daemon's socket.
    #[arg(long, global = true, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Run the leash service: load the programs, serve the socket, enforce leases (root).
    ///
    /// On SIGTERM or SIGINT every live tree is killed before the daemon exits: a tree that
    /// outlives its enforcer is the failure leash exists to prevent. On SIGHUP it hands over:
    /// it exits and leaves every tree tracked in the pins, for the next daemon to take over
    /// (an upgrade without killing anything). If it dies any other way, the same happens.
    Daemon(daemon::DaemonArgs),
    /// Run CMD on a leash: when CMD exits, whatever it left running is killed, and if this
    /// command is killed (even with SIGKILL), the whole tree dies with it. Exits with CMD's
    /// status (128+N for signal N); as a shell, 127 if CMD was not found and 126 if it could
    /// not be executed (`leash: CMD: command not found`, `leash: ./x: Permission denied`);
    /// or 125 if leash failed and CMD never ran (no daemon, or the daemon refused to register
    /// it, e.g. the uid holds as many trees as allowed).
    ///
    /// SIGTERM, SIGINT and SIGHUP to this command kill the tree (with its grace period); it
    /// exits 128+N once the tree is empty. A tree killed from outside (`leash kill`, the
    /// daemon's shutdown) ends CMD with SIGTERM: this command exits 143 and says on stderr
    /// why the tree was killed.
    Run(host::RunArgs),
    /// Register this process under another host's lease, then exec CMD: the way to spawn under
    /// a lease from any language (prefix the argv).
    ///
    /// The host's lease token (from its `hello` reply) comes on an inherited file descriptor,
    /// `--lease-fd N`, or in the environment, `LEASH_LEASE`: exactly one of them. Never on the
    /// command line: every local user can read a process's arguments (/proc/PID/cmdline), and
    /// whoever holds the token can put processes under the host's lease. The descriptor is
    /// closed and LEASH_LEASE removed before CMD runs, so neither CMD nor anything it starts
    /// inherits the token; LEASH_LEASE is wiped from the shim's own environment as it starts,
    /// so /proc/PID/environ does not show it while the shim registers. Exits 125 if leash
    /// failed and CMD never ran; as a shell, 127 if CMD was not found and 126 if it was found
    /// but could not be executed (`leash: CMD: command not found`). With `--status-fd M` the
    /// host is told on descriptor M, one JSON line each, whether CMD was registered (and its
    /// tree), refused (and why), or could not be executed: what the Python and Node host
    /// libraries spawn with (docs/HOSTS.md).
    Exec(host::ExecArgs),
    /// Register a running process PID, with its descendants, as a new tree under another
    /// host's lease: the way a host that cannot send a descriptor over a socket (Node.js) names
    /// the process by a pidfd, which is right in a container's pid namespace as a bare pid is
    /// not.
    ///
    /// The lease token comes as for `leash exec`: on descriptor `--lease-fd N`, or in
    /// LEASH_LEASE. PID is a number of this command's pid namespace; the daemon checks that
    /// both this command and the lease's owner may signal the process. Prints the tree's id,
    /// or, with `--status-fd M`, reports on descriptor M as `leash exec` does (`root` is PID).
    Adopt(host::AdoptArgs),
    /// Kill a tree (SIGTERM, the grace period, then SIGKILL until it is empty).
    ///
    /// TREE is a tree's id (`leash ls`); given the pid of a process in a tree you may see, it
    /// says which tree that is.
    Kill(host::KillArgs),
    /// The live view: leases, their trees as process trees, events as they happen.
    ///
    /// Keys: arrows or j/k move, enter folds a tree, K kills the selected tree (after a y/n),
    /// / filters by command or pid (esc clears), q quits. Non-root users see their own trees.
    /// What a tree's processes do once its kill started is shown as part of the kill. Needs a
    /// terminal; without one, --json prints the events as JSON lines.
    Watch(watch::WatchArgs),
    /// List the trees on a leash, each as a process tree (yours; all of them for root).
    ///
    /// Columns: pid, user, state, CPU % (ls lists twice, 200 ms apart), resident memory, age,
    /// command line; each tree with its totals, and the leases whose trees are gone.
    Ls(show::ShowArgs),
    /// The daemon's state: version, programs attached, map capacity and fill, events dropped,
    /// leases.
    Status(show::ShowArgs),
    /// Follow one tree live, without the daemon: start CMD (or adopt --pid) and print every
    /// process that joins or leaves, until the tree is empty. Nothing is killed (root).
    Track(track::TrackArgs),
    /// Check that the daemon can run here and that this process reaches it; for each problem,
    /// what is wrong and the command or setting that fixes it.
    ///
    /// In order: the kernel (version, BTF, lockdown, the bpf system call, a tp_btf program
    /// attached and detached, ring buffers, the helpers the programs call), bpffs at
    /// /sys/fs/bpf, the socket's directory (root's alone, as the daemon requires), this
    /// process's pid namespace, the daemon on the socket (--socket, LEASH_SOCKET) and its
    /// version against this leash's, and its pins and their ABI. Each is ok, WARN, FAIL, or
    /// ROOT? (needs root to check: run as an ordinary user, doctor checks what it can and says
    /// which checks need root). The probes that load BPF pin nothing and leave nothing
    /// attached; every check gives up after a few seconds (a daemon that never answers fails).
    ///
    /// Exits 0 only when nothing FAILs: the daemon can run here and answers on the socket;
    /// otherwise 1. --json prints the findings and the verdict as one JSON document
    /// (docs/JSON.md).
    Doctor(doctor::DoctorArgs),
    /// Print the completion script for a shell (bash, zsh or fish) to stdout.
    ///
    /// To try it in the running shell: `source <(leash completions bash)`. Packages install
    /// the scripts where each shell looks for them: bash in
    /// /usr/share/bash-completion/completions/leash, zsh in
    /// /usr/share/zsh/vendor-completions/_leash, fish in
    /// /usr/share/fish/vendor_completions.d/leash.fish (`cargo xtask install` does so under
    /// its prefix).
    Completions(generate::CompletionsArgs),
    /// Write the manual pages (leash.1, leash-run.1, ...) into DIR, for packagers.
    #[command(hide = true)]
    Manpages(generate::ManpagesArgs),
}

pub(crate) fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(match cli.command {
        // What loading the programs says is the daemon's news; `track` prints its tree, and
        // its log keeps to warnings.
        Commands::Track(_) => "warn",
        _ => "info",
    });
    // `run` and `exec` exit with their command's status; their own failures need a code of
    // their own, which a command rarely uses (as env, nohup and docker run do).
    let failure = match cli.command {
        Commands::Run(_) | Commands::Exec(_) => ExitCode::from(HOST_FAILURE),
        _ => ExitCode::FAILURE,
    };
    let result = match cli.command {
        Commands::Daemon(args) => daemon::daemon(cli.socket, args),
        Commands::Run(args) => host::run(&cli.socket, args),
        Commands::Exec(args) => host::exec(&cli.socket, args),
        Commands::Adopt(args) => host::adopt(&cli.socket, args),
        Commands::Kill(args) => host::kill(&cli.socket, args),
        Commands::Watch(args) => watch::watch(&cli.socket, args),
        Commands::Ls(args) => show::ls(&cli.socket, args),
        Commands::Status(args) => show::status(&cli.socket, args),
        Commands::Track(args) => track::track(args),
        Commands::Doctor(args) => doctor::doctor(&cli.socket, args),
        Commands::Completions(args) => generate::completions(args),
        Commands::Manpages(args) => generate::manpages(args),
    };
    match result {
        Ok(code) => code,
        // Whoever read stdout is gone (`leash ls | head`): nothing to say, nobody to say it to.
        Err(_) if stdout::reader_gone() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leash: {e:#}");
            if e.chain().any(|cause| {
                matches!(
                    cause.downcast_ref::<leash_client::Error>(),
                    Some(leash_client::Error::Connect { .. })
                )
            }) {
                eprintln!(
                    "leash: `leash doctor` checks the daemon and this machine, and says what to fix"
                );
            }
            if e.chain()
                .any(|cause| cause.is::<Unsupported>() || cause.is::<PinsHeld>())
            {
                // The unit does not restart a daemon that exits so: nothing would change until
                // someone acts (a kernel that lacks something, another daemon on the pins).
                return ExitCode::from(NOT_RESTARTED);
            }
            failure
        }
    }
}

/// The exit code when the kernel cannot run leash, or another daemon holds the pins (sysexits'
/// EX_CONFIG). dist/leash.service names it in RestartPreventExitStatus=.
const NOT_RESTARTED: u8 = 78;

/// The exit code of `leash run` and `leash exec` when leash failed and the command never ran
/// (127 and 126, a command not found or not executable, are the command's: exec_failure).
pub(super) const HOST_FAILURE: u8 = 125;

/// A child's status as a shell reports it: its exit code, or 128+N for signal N.
fn exit_code(status: ExitStatus) -> ExitCode {
    let code = status
        .code()
        .or_else(|| status.signal().map(|n| 128 + n))
        .unwrap_or(1);
    ExitCode::from(code.clamp(0, 255) as u8)
}
