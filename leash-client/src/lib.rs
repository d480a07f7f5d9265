//! The leash host library. A host (a program that starts AI agents) connects to the leash
//! daemon; the connection is its *lease*. Every tree registered under the lease is killed when
//! the host dies or the connection closes, however that happens, unless it was released.
//!
//! ```no_run
//! use std::process::Command;
//! use leash_client::{Client, TreeOptions};
//!
//! let mut leash = Client::connect()?;
//! let (tree, mut agent) = leash.spawn(Command::new("my-agent").arg("--acp"), &TreeOptions::default())?;
//! // ... when the run is over, or cancelled:
//! let summary = leash.kill(tree, None)?;
//! agent.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! It depends on serde only: no async runtime, no eBPF. Calls block.

mod error;
mod lease_token;
pub mod protocol;
pub mod sys;

use std::{
    collections::VecDeque,
    ffi::{OsStr, OsString},
    io::{self, BufRead, BufReader, Write},
    os::{
        fd::{AsFd, BorrowedFd, RawFd},
        unix::net::UnixStream,
    },
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

pub use error::{Error, Result};
pub use lease_token::{LEASE_ENV, MAX_TOKEN_BYTES, read_lease_token};
pub use protocol::{
    ClosingReason, ErrorCode, Event, EventKind, EventReason, KillSummary, LeaseInfo, LeaseSummary,
    Listing, MemberInfo, RootExitPolicy, StatusInfo, TreeId, TreeInfo,
};
use protocol::{MAX_REPLY_BYTES, Op, PROTOCOL_VERSION, Reply, Request, ServerLine};

/// How a new tree is enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeOptions {
    /// Kill the rest of the tree when its root exits (the default), or keep it.
    pub on_root_exit: RootExitPolicy,
    /// Time between SIGTERM and SIGKILL when the tree is killed; the daemon's default if None.
    pub grace: Option<Duration>,
}

/// A connection to the daemon, and so a lease.
///
/// Two events come whether or not the client subscribed, and [`Client::next_event`] returns
/// them too: `refused` (a request another process sent on this connection was refused; the
/// lease goes on) and `closing` (the daemon closes the connection: the call that finds it
/// closed fails with [`Error::Closed`], which says why).
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    events: VecDeque<Event>,
    lease: LeaseInfo,
    /// Where the daemon was reached: the `leash exec` shim must reach the same one.
    socket: PathBuf,
    /// Why the daemon said it closes the connection (its `closing` event), once it did.
    closing: Option<ClosingReason>,
}

/// The connection to the daemon (for what a caller asks the kernel about it: its peer).
impl AsFd for Client {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.writer.as_fd()
    }
}

impl Client {
    /// Connects to the socket named by `LEASH_SOCKET`, or the default one.
    pub fn connect() -> Result<Self> {
        Self::connect_to(protocol::socket_path())
    }

    pub fn connect_to(path: impl AsRef<Path>) -> Result<Self> {
        Self::connect_with_timeout(path, None)
    }

    /// [`Client::connect_to`], each read and write of the connection given `timeout` at most
    /// (an [`Error::Io`] of kind `WouldBlock` when it passes): for a caller that must not hang
    /// on a daemon that took the connection and never answers.
    pub fn connect_with_timeout(path: impl AsRef<Path>, timeout: Option<Duration>) -> Result<Self> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|error| Error::Connect {
            path: path.to_owned(),
            error,
        })?;
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        let mut client = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 1,
            events: VecDeque::new(),
            lease: LeaseInfo {
                id: 0,
                token: String::new(),
            },
            socket: path.to_owned(),
            closing: None,
        };
        match client.request(Op::Hello {
            protocol: PROTOCOL_VERSION,
        })? {
            Reply::Hello { lease, .. } => client.lease = lease,
            other => return Err(unexpected(&other)),
        }
        Ok(client)
    }

    /// This connection's lease.
    pub fn lease(&self) -> &LeaseInfo {
        &self.lease
    }

    /// Starts `command` as the root of a new tree. The child is held between fork and exec
    /// until the daemon has it in the kernel map: nothing of the command runs untracked. The
    /// child is named to the daemon by a pidfd, so this works in any pid namespace.
    pub fn spawn(
        &mut self,
        command: &mut Command,
        options: &TreeOptions,
    ) -> Result<(TreeId, Child)> {
        let mut tree = None;
        let child = sys::spawn_held(command, |pid| {
            tree = Some(self.adopt(pid, options)?);
            Ok::<_, Error>(())
        })
        .map_err(|e| match e {
            sys::SpawnHeldError::Spawn(e) => Error::Spawn(e),
            thread @ sys::SpawnHeldError::Thread(_) => {
                Error::Spawn(io::Error::other(thread.to_string()))
            }
            sys::SpawnHeldError::Register(e) => e,
        })?;
        let tree = tree.ok_or_else(|| Error::Protocol("registration did not run".into()))?;
        Ok((tree, child))
    }

    /// Registers a running process, with its existing descendants, as a new tree. `pid` is a
    /// number of this process's pid namespace: the process is named to the daemon by a pidfd,
    /// which is right in whatever namespace the daemon runs.
    pub fn adopt(&mut self, pid: u32, options: &TreeOptions) -> Result<TreeId> {
        match sys::pidfd_open(pid) {
            Ok(pidfd) => self.register_pidfd(pidfd.as_fd(), None, options),
            // No such process, or a thread's id: the daemon says which, in its words (the
            // process a thread belongs to, say), as it does for any pid.
            Err(_) => self.register(pid, None, options),
        }
    }

    /// Registers `pid` as the root of a new tree under this lease, or under the lease whose
    /// token is given. `pid` is a number of the daemon's pid namespace: a client in another
    /// one (a container's) is refused, and names the process by a pidfd
    /// ([`Client::register_pidfd`]) or registers itself ([`Client::register_self`]).
    pub fn register(
        &mut self,
        pid: u32,
        lease_token: Option<&str>,
        options: &TreeOptions,
    ) -> Result<TreeId> {
        self.register_process(Some(pid), None, lease_token, options)
    }

    /// Registers the process `pidfd` names as the root of a new tree under this lease, or
    /// under the lease whose token is given. The pidfd travels with the request (SCM_RIGHTS).
    pub fn register_pidfd(
        &mut self,
        pidfd: BorrowedFd<'_>,
        lease_token: Option<&str>,
        options: &TreeOptions,
    ) -> Result<TreeId> {
        self.register_process(None, Some(pidfd), lease_token, options)
    }

    /// Registers this very process as the root of a new tree under the lease whose token is
    /// given (what `leash exec` does before it execs its command). The daemon knows the
    /// process from the connection, in whatever pid namespace it runs.
    pub fn register_self(&mut self, lease_token: &str, options: &TreeOptions) -> Result<TreeId> {
        self.register_process(None, None, Some(lease_token), options)
    }

    fn register_process(
        &mut self,
        pid: Option<u32>,
        pidfd: Option<BorrowedFd<'_>>,
        lease_token: Option<&str>,
        options: &TreeOptions,
    ) -> Result<TreeId> {
        let op = Op::Register {
            pid,
            pidfd: pidfd.is_some(),
            lease: lease_token.map(str::to_owned),
            on_root_exit: Some(options.on_root_exit),
            grace_ms: options.grace.map(duration_ms),
        };
        match self.request_with(op, pidfd)? {
            Reply::Registered { tree, .. } => Ok(tree),
            other => Err(unexpected(&other)),
        }
    }

    /// The argv that runs `command` under this lease from any language: `leash exec --socket
    /// SOCKET --lease-fd FD -- COMMAND...`. The `leash exec` shim reads this lease's token from
    /// its descriptor `lease_fd`, closes it, registers itself under the lease, then execs the
    /// command. The caller passes the token on that descriptor (a pipe the child inherits as
    /// `lease_fd`, holding the token and a newline, or closed after it); [`Client::exec_command`]
    /// does all of it for a Rust host. `leash` is the path of the leash binary.
    ///
    /// The token is never put on argv, which every local user can read in /proc/PID/cmdline.
    pub fn exec_argv<S: AsRef<OsStr>>(
        &self,
        leash: impl AsRef<OsStr>,
        lease_fd: RawFd,
        command: impl IntoIterator<Item = S>,
    ) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            leash.as_ref().into(),
            "exec".into(),
            "--socket".into(),
            self.socket.clone().into(),
            "--lease-fd".into(),
            lease_fd.to_string().into(),
            "--".into(),
        ];
        argv.extend(command.into_iter().map(|arg| arg.as_ref().to_owned()));
        argv
    }

    /// A [`Command`] that runs `command` under this lease through the `leash exec` shim at
    /// `leash` ([`Client::exec_argv`]), with the token on a pipe: the token is written into a
    /// new pipe, whose read end the child inherits (under the number its argv names) and the
    /// shim closes before it execs the command. The command sees the token nowhere: not in
    /// its argv, its environment (`LEASH_LEASE` is removed from it) or its descriptors. No other
    /// child inherits the pipe. Set stdio, environment and so on, then spawn it **once**: the
    /// pipe holds one copy of the token.
    ///
    /// For a host that cannot hold the child before exec itself (it spawns through another
    /// library); otherwise [`Client::spawn`] needs no shim.
    pub fn exec_command<S: AsRef<OsStr>>(
        &self,
        leash: impl AsRef<OsStr>,
        command: impl IntoIterator<Item = S>,
    ) -> Result<Command> {
        let (reader, mut writer) = io::pipe().map_err(Error::Spawn)?;
        // A new pipe holds at least 4096 bytes: this write cannot block. The write end closes
        // here, so the shim reads the token to the end of the pipe.
        writeln!(writer, "{}", self.lease.token).map_err(Error::Spawn)?;
        drop(writer);
        let mut shim = Command::new(leash.as_ref());
        let fd = sys::pass_fd(&mut shim, reader.into()).map_err(Error::Spawn)?;
        let argv = self.exec_argv(leash.as_ref(), fd, command);
        shim.args(&argv[1..]).env_remove(LEASE_ENV);
        Ok(shim)
    }

    /// Stops enforcing `tree`: its processes are left alone.
    pub fn release(&mut self, tree: TreeId) -> Result<()> {
        match self.request(Op::Release { tree })? {
            Reply::Released { .. } => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Kills `tree` (SIGTERM, `grace`, then SIGKILL until it is empty) and returns when it is
    /// empty. `None` uses the tree's own grace period.
    pub fn kill(&mut self, tree: TreeId, grace: Option<Duration>) -> Result<KillSummary> {
        let op = Op::Kill {
            tree,
            grace_ms: grace.map(duration_ms),
        };
        match self.request(op)? {
            Reply::Killed(summary) => Ok(summary),
            other => Err(unexpected(&other)),
        }
    }

    /// The trees this client may see (its uid's; all for root), with their members.
    pub fn list(&mut self) -> Result<Vec<TreeInfo>> {
        self.list_trees(None)
    }

    /// One tree as `list` shows it (None if this client may not see it), with more of its
    /// members when it is large.
    pub fn list_tree(&mut self, tree: TreeId) -> Result<Option<TreeInfo>> {
        Ok(self.list_trees(Some(tree))?.into_iter().next())
    }

    fn list_trees(&mut self, tree: Option<TreeId>) -> Result<Vec<TreeInfo>> {
        let op = Op::List {
            tree,
            leases: false,
        };
        match self.request(op)? {
            Reply::Trees(trees) => Ok(trees),
            other => Err(unexpected(&other)),
        }
    }

    /// The trees this client may see, as [`Client::list`], and the leases that hold them or
    /// have held one: a host whose trees are all gone is still there while its lease lasts.
    /// From a daemon that does not report leases, `leases` is empty.
    pub fn listing(&mut self) -> Result<Listing> {
        let op = Op::List {
            tree: None,
            leases: true,
        };
        match self.request(op)? {
            Reply::Listing(listing) => Ok(listing),
            Reply::Trees(trees) => Ok(Listing {
                trees,
                leases: Vec::new(),
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// The daemon's state: version, programs, capacity and fill, events dropped.
    pub fn status(&mut self) -> Result<StatusInfo> {
        match self.request(Op::Status)? {
            Reply::Status(status) => Ok(status),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks for tree events on this connection; read them with [`Client::next_event`].
    pub fn subscribe(&mut self) -> Result<()> {
        match self.request(Op::Subscribe)? {
            Reply::Subscribed => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// The next tree event, waiting up to `timeout` (forever if None). None on timeout.
    pub fn next_event(&mut self, timeout: Option<Duration>) -> Result<Option<Event>> {
        if let Some(event) = self.events.pop_front() {
            return Ok(Some(event));
        }
        self.reader.get_ref().set_read_timeout(timeout)?;
        let line = self.read_line();
        self.reader.get_ref().set_read_timeout(None)?;
        let line = match line {
            Ok(line) => line,
            Err(Error::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match line {
            ServerLine::Event { event } => Ok(Some(event)),
            _ => Err(Error::Protocol("a reply to no request".into())),
        }
    }

    fn request(&mut self, op: Op) -> Result<Reply> {
        self.request_with(op, None)
    }

    /// Sends a request, with `fd` attached to its line if given, and waits for its reply.
    fn request_with(&mut self, op: Op, fd: Option<BorrowedFd<'_>>) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_string(&Request { id, op })
            .map_err(|e| Error::Protocol(e.to_string()))?;
        line.push('\n');
        let sent = match fd {
            Some(fd) => sys::send_with_fd(&self.writer, line.as_bytes(), fd),
            None => self.writer.write_all(line.as_bytes()),
        };
        if let Err(e) = sent {
            return Err(self.write_failed(e));
        }
        loop {
            return match self.read_line()? {
                ServerLine::Event { event } => {
                    self.events.push_back(event);
                    continue;
                }
                ServerLine::Reply { id: answers, ok } if answers == id => Ok(ok),
                ServerLine::Error {
                    id: Some(answers),
                    error,
                } if answers == id => Err(Error::Daemon {
                    code: error.code,
                    message: error.message,
                }),
                other => Err(Error::Protocol(match other.id() {
                    Some(answers) => format!("a reply to request {answers} while waiting for {id}"),
                    None => format!("an error of no request while waiting for {id}"),
                })),
            };
        }
    }

    fn read_line(&mut self) -> Result<ServerLine> {
        let line = match read_bounded_line(&mut self.reader, MAX_REPLY_BYTES) {
            Ok(Some(line)) => line,
            Ok(None) => return Err(Error::Closed(self.closing)),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                return Err(Error::Closed(self.closing));
            }
            Err(e) => return Err(Error::Io(e)),
        };
        let line: ServerLine =
            serde_json::from_slice(&line).map_err(|e| Error::Protocol(e.to_string()))?;
        if let ServerLine::Event { event } = &line
            && event.kind == EventKind::Closing
        {
            // An unknown reason is a closing all the same, without what it means.
            self.closing = event.closing_reason();
        }
        Ok(line)
    }

    /// The error of a request that could not be sent: if the daemon had closed the connection,
    /// why, as its last lines say (its `closing` event, read now with what came before it,
    /// kept for [`Client::next_event`]).
    fn write_failed(&mut self, error: io::Error) -> Error {
        if !matches!(
            error.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            return Error::Io(error);
        }
        loop {
            match self.read_line() {
                Ok(ServerLine::Event { event }) => self.events.push_back(event),
                // A reply to no request: nothing is waiting for it now.
                Ok(_) => {}
                Err(closed @ Error::Closed(_)) => return closed,
                Err(_) => return Error::Closed(self.closing),
            }
        }
    }
}

/// Reads one line (without its newline), refusing lines longer than `max` bytes. None at end
/// of stream.
fn read_bounded_line(reader: &mut impl BufRead, max: usize) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (available.len(), false),
        };
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if line.len() > max {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        if done {
            line.pop();
            return Ok(Some(line));
        }
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn unexpected(reply: &Reply) -> Error {
    Error::Protocol(format!("unexpected reply {reply:?}"))
}

#[cfg(test)]
mod tests;
