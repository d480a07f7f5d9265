//! `leash daemon`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
use clap::Args;
use leash::{
    Capacity, daemon,
    daemon::{MetricsAddr, UidLimits},
    kernel::GuardChoice,
};

/// Below this open file limit, the daemon warns that it serves few connections at once.
/// Descriptors kept for kills (see `sys::with_reserve`): a kill holds one pidfd at a time, and
/// reads /proc beside it.
const ENFORCEMENT_RESERVE: usize = 8;
const FEW_DESCRIPTORS: u64 = 4096;

#[derive(Args, Debug)]
pub(super) struct DaemonArgs {
    /// Processes tracked at once, over all trees (kernel memory is reserved for them).
    #[arg(long, default_value_t = Capacity::default().members)]
    max_members: u32,
    /// Trees registered at once.
    #[arg(long, default_value_t = Capacity::default().trees)]
    max_trees: u32,
    /// Processes one non-root uid may have on a leash at once, over all its trees (an eighth of
    /// --max-members if not given; 0: no limit). The member map is shared by every user: this
    /// keeps one user's fork storm from filling it for the others. A tree that forks past it
    /// is killed.
    #[arg(long)]
    max_members_per_uid: Option<u32>,
    /// Trees one non-root uid may hold at once.
    #[arg(long, default_value_t = 64)]
    max_trees_per_uid: usize,
    /// Connections one non-root uid may hold open at once; more are refused (limit_reached).
    #[arg(long, default_value_t = UidLimits::default().connections)]
    max_connections_per_uid: usize,
    /// Requests one non-root uid may make a second, over all its connections (`list` and
    /// `register` count 20). Over it, a request is refused (limit_reached) and its connection
    /// is not read until the budget is back: one user's flood slows that user alone.
    #[arg(long, default_value_t = UidLimits::default().requests_per_second)]
    requests_per_second_per_uid: u32,
    /// Time between SIGTERM and SIGKILL for trees that do not set their own.
    #[arg(long, default_value = "2s", value_parser = super::duration::parse)]
    grace: Duration,
    /// Where the programs and maps are pinned, on a BPF filesystem (bpffs is mounted at
    /// /sys/fs/bpf if needed). If the daemon dies, its programs go on tracking every tree,
    /// and the next daemon started with the same directory takes them over. A clean stop
    /// (SIGTERM) kills every tree and removes the pins.
    #[arg(long, default_value = "/sys/fs/bpf/leash", conflicts_with = "no_pin")]
    pin_dir: PathBuf,
    /// Do not pin: tracking ends with the daemon, however it ends.
    #[arg(long)]
    no_pin: bool,
    /// Serve Prometheus metrics at ADDR: a Unix socket path or a loopback address with a port.
    /// Off unless given.
    ///
    /// The text format, for `GET /metrics` over HTTP/1.x. ADDR is an absolute path (e.g.
    /// /run/leash/metrics.sock; its directory must be root's alone, like --socket's; the socket
    /// is removed when the daemon stops) or 127.0.0.1:PORT, [::1]:PORT (port 0: the kernel
    /// picks one, and the log says which). The endpoint has no authentication, so any other
    /// address is refused. The socket is root's alone (0600), or its group's too with
    /// --metrics-group; a loopback port is open to every local user (the figures are counts
    /// only: no pid, uid or command), and any of them could hold its few connections and keep
    /// a scraper out.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<MetricsAddr>,
    /// The group (a name, or a number) that may connect to the --metrics socket besides root:
    /// the socket is then 0660 root:GROUP. Put the scraper's user in it. Only for a Unix socket.
    #[arg(long, value_name = "GROUP", requires = "metrics")]
    metrics_group: Option<String>,
    /// Which ptrace guard refuses a member's ptrace attach, pidfd_getfd, process_vm_writev
    /// and /proc/PID/mem writes to processes outside its tree: `auto` (a BPF LSM program on
    /// ptrace_access_check where the BPF LSM is active; else fmod_ret on
    /// security_ptrace_access_check, with a kprobe beside it that SIGKILLs the member on a
    /// kernel that may skip fmod_ret (7.x); where the kernel cannot attach fmod_ret, the kprobe
    /// alone; where it has no kprobes either, syscall tracepoints that SIGKILL the member),
    /// `fmod_ret` (not the LSM program), `kprobe` (neither), `tracepoints` (the last fallback
    /// alone), or `off`. The log and `leash status` say which is in place.
    #[arg(
        long,
        default_value = "auto",
        value_parser = ["auto", "fmod_ret", "kprobe", "tracepoints", "off"]
    )]
    ptrace_guard: String,
}

pub(super) fn daemon(socket: PathBuf, args: DaemonArgs) -> Result<ExitCode> {
    // Before anything fails on the way for want of it, with an error that names the fix.
    let euid = leash::sys::effective_uid();
    if euid != 0 {
        bail!(
            "leash daemon runs as root, not as uid {euid}: it loads eBPF programs into the \
             kernel, signals every user's processes and binds a socket in a directory only root \
             may write; run it as root (`sudo leash daemon`, or the service: `systemctl start \
             leash`). Hosts and users need no daemon of their own: they connect to root's"
        );
    }
    // A relative path would be another socket from every client's working directory.
    if socket.is_relative() {
        bail!(
            "--socket {} is a relative path: give an absolute one (e.g. --socket {}), which \
             every client can name from wherever it runs",
            socket.display(),
            std::path::absolute(&socket).map_or_else(
                |_| "/run/leash/leash.sock".to_owned(),
                |path| path.display().to_string()
            )
        );
    }
    // Every connection holds descriptors (its socket, its host's pidfd), and so does every
    // kill: the common soft limit of 1024 would refuse clients after a few hundred.
    match leash::sys::raise_fd_limit() {
        Ok(limit) if limit.soft < FEW_DESCRIPTORS => tracing::warn!(
            soft = limit.soft,
            hard = limit.hard,
            "open file limit is low: it bounds the connections served at once (raise the hard \
             limit, e.g. LimitNOFILE= in a systemd unit)"
        ),
        // Enough: news only when looked for.
        Ok(limit) => tracing::debug!(
            soft = limit.soft,
            hard = limit.hard,
            was = limit.was,
            "open file limit"
        ),
        Err(e) => tracing::warn!("cannot raise the open file limit: {e}"),
    }
    // Held for enforcement alone: a kill in a full table signals all the same.
    if let Err(e) = leash::sys::keep_reserve(ENFORCEMENT_RESERVE) {
        tracing::warn!("cannot keep descriptors in reserve for kills: {e}");
    }
    let config = daemon::Config {
        socket,
        capacity: Capacity {
            members: args.max_members,
            trees: args.max_trees,
            members_per_uid: match args.max_members_per_uid {
                None => Some(Capacity::default_members_per_uid(args.max_members)),
                Some(0) => None,
                Some(quota) => Some(quota),
            },
            ptrace_guard: match args.ptrace_guard.as_str() {
                "fmod_ret" => GuardChoice::FmodRet,
                "kprobe" => GuardChoice::Kprobe,
                "tracepoints" => GuardChoice::Tracepoints,
                "off" => GuardChoice::Off,
                _ => GuardChoice::Auto,
            },
            ..Capacity::default()
        },
        default_grace: args.grace,
        max_trees_per_uid: args.max_trees_per_uid,
        uid_limits: UidLimits {
            connections: args.max_connections_per_uid,
            requests_per_second: args.requests_per_second_per_uid.max(1),
        },
        pin_root: (!args.no_pin).then_some(args.pin_dir),
        metrics_group: metrics_group(args.metrics.as_ref(), args.metrics_group.as_deref())?,
        metrics: args.metrics,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(daemon::run(config))?;
    Ok(ExitCode::SUCCESS)
}

/// The group id `--metrics-group` names: a number, or a group's name. Refused beside a TCP
/// address, whose connections no file mode restricts.
fn metrics_group(addr: Option<&MetricsAddr>, group: Option<&str>) -> Result<Option<u32>> {
    let Some(group) = group else {
        return Ok(None);
    };
    if let Some(MetricsAddr::Tcp(tcp)) = addr {
        bail!(
            "--metrics-group applies to a Unix socket, not to {tcp}: every local user may \
             connect to a loopback port (serve the metrics on a socket, e.g. \
             /run/leash/metrics.sock, to keep them to a group)"
        );
    }
    // A number first: it needs no group database (the image has none).
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(Some(gid));
    }
    match leash::sys::group_id(group) {
        Ok(Some(gid)) => Ok(Some(gid)),
        Ok(None) => bail!("--metrics-group {group}: no such group"),
        Err(e) => bail!("--metrics-group {group}: cannot look it up ({e}); give its number"),
    }
}
