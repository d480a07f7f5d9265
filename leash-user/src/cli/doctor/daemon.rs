//! The daemon: whether it answers, of which version, and whether it and this process see each
//! other's pids (the pid namespaces).

use std::{
    io::{self, ErrorKind},
    os::fd::AsFd,
    path::Path,
};

use leash_client::{
    Client, Error as ClientError, StatusInfo,
    protocol::{DEFAULT_SOCKET, PROTOCOL_VERSION},
};

use super::{
    bounds::TIMEOUT,
    report::{Finding, Status},
};

/// The inode number of the initial pid namespace (PROC_PID_INIT_INO), the host's.
const INITIAL_PID_NAMESPACE: u32 = 0xEFFF_FFFC;

/// The caller's pid namespace, and whether the daemon and this process see each other.
pub(super) fn pid_namespace(daemon: Option<&DaemonReply>) -> Finding {
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
pub(super) struct DaemonReply {
    pub(super) status: StatusInfo,
    /// The daemon's pid as this process's namespace numbers it: 0 outside it.
    peer_pid: i32,
}

pub(super) enum DaemonError {
    Connect(io::Error),
    /// It took the connection, and did not answer in time.
    Silent,
    Closed,
    Refused(String),
    Protocol(String),
}

/// `hello` and `status` on a connection of its own, each reply waited for [`TIMEOUT`] at most.
pub(super) fn ask_daemon(socket: &Path) -> Result<DaemonReply, DaemonError> {
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
            ClientError::Closed(_) => Self::Closed,
            ClientError::Daemon { code, message } => Self::Refused(format!("{message} ({code})")),
            e => Self::Protocol(e.to_string()),
        }
    }
}

/// The daemon: reached, and of which version.
pub(super) fn daemon_finding(socket: &Path, daemon: &Result<DaemonReply, DaemonError>) -> Finding {
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
