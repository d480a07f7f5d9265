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

pub mod protocol;
pub mod sys;

use std::{
    collections::VecDeque,
    ffi::OsString,
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

pub use protocol::{
    ErrorCode, Event, EventKind, KillSummary, LeaseInfo, MemberInfo, RootExitPolicy, StatusInfo,
    TreeId, TreeInfo,
};
use protocol::{MAX_REPLY_BYTES, Op, PROTOCOL_VERSION, Reply, Request, ServerLine};

/// What can go wrong talking to the daemon.
#[derive(Debug, thiserror::Error)]
// The io errors are part of the message and not `source`s: a report that prints the chain
// (anyhow's `{:#}`) would say them twice.
pub enum Error {
    #[error(
        "cannot connect to the leash daemon at {path}: {error} (is `leash daemon` running? \
         LEASH_SOCKET names another socket)"
    )]
    Connect { path: PathBuf, error: io::Error },
    #[error("talking to the leash daemon: {0}")]
    Io(io::Error),
    #[error("the leash daemon sent something unexpected: {0}")]
    Protocol(String),
    #[error("the leash daemon refused: {message} ({code})")]
    Daemon { code: ErrorCode, message: String },
    #[error("starting the command: {0}")]
    Spawn(io::Error),
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a new tree is enforced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeOptions {
    /// Kill the rest of the tree when its root exits (the default), or keep it.
    pub on_root_exit: RootExitPolicy,
    /// Time between SIGTERM and SIGKILL when the tree is killed; the daemon's default if None.
    pub grace: Option<Duration>,
}

/// A connection to the daemon, and so a lease.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    events: VecDeque<Event>,
    lease: LeaseInfo,
}

impl Client {
    /// Connects to the socket named by `LEASH_SOCKET`, or the default one.
    pub fn connect() -> Result<Self> {
        Self::connect_to(protocol::socket_path())
    }

    pub fn connect_to(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let stream = UnixStream::connect(path).map_err(|error| Error::Connect {
            path: path.to_owned(),
            error,
        })?;
        let mut client = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            next_id: 1,
            events: VecDeque::new(),
            lease: LeaseInfo {
                id: 0,
                token: String::new(),
            },
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
    /// until the daemon has it in the kernel map: nothing of the command runs untracked.
    pub fn spawn(
        &mut self,
        command: &mut Command,
        options: &TreeOptions,
    ) -> Result<(TreeId, Child)> {
        let mut tree = None;
        let child = sys::spawn_held(command, |pid| {
            tree = Some(self.register(pid, None, options)?);
            Ok::<_, Error>(())
        })
        .map_err(|e| match e {
            sys::SpawnHeldError::Spawn(e) => Error::Spawn(e),
            sys::SpawnHeldError::Register(e) => e,
        })?;
        let tree = tree.ok_or_else(|| Error::Protocol("registration did not run".into()))?;
        Ok((tree, child))
    }

    /// Registers a running process, with its existing descendants, as a new tree.
    pub fn adopt(&mut self, pid: u32, options: &TreeOptions) -> Result<TreeId> {
        self.register(pid, None, options)
    }

    /// Registers `pid` as the root of a new tree under this lease, or under the lease whose
    /// token is given (what `leash exec --lease TOKEN` does for itself).
    pub fn register(
        &mut self,
        pid: u32,
        lease_token: Option<&str>,
        options: &TreeOptions,
    ) -> Result<TreeId> {
        let op = Op::Register {
            pid,
            lease: lease_token.map(str::to_owned),
            on_root_exit: Some(options.on_root_exit),
            grace_ms: options.grace.map(duration_ms),
        };
        match self.request(op)? {
            Reply::Registered { tree, .. } => Ok(tree),
            other => Err(unexpected(&other)),
        }
    }

    /// The argv that runs `command` under this lease from any language: the `leash exec` shim
    /// registers itself, then execs the command. `leash` is the path of the leash binary.
    pub fn exec_argv<S: Into<OsString>>(
        &self,
        leash: impl Into<OsString>,
        command: impl IntoIterator<Item = S>,
    ) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            leash.into(),
            "exec".into(),
            "--lease".into(),
            self.lease.token.clone().into(),
            "--".into(),
        ];
        argv.extend(command.into_iter().map(Into::into));
        argv
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
        match self.request(Op::List)? {
            Reply::Trees(trees) => Ok(trees),
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
        match line.event {
            Some(event) => Ok(Some(event)),
            None => Err(Error::Protocol("a reply to no request".into())),
        }
    }

    fn request(&mut self, op: Op) -> Result<Reply> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_string(&Request { id, op })
            .map_err(|e| Error::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        loop {
            let reply = self.read_line()?;
            if let Some(event) = reply.event {
                self.events.push_back(event);
                continue;
            }
            if reply.id != Some(id) {
                return Err(Error::Protocol(format!(
                    "a reply to request {:?} while waiting for {id}",
                    reply.id
                )));
            }
            return match (reply.ok, reply.error) {
                (Some(ok), _) => Ok(ok),
                (None, Some(error)) => Err(Error::Daemon {
                    code: error.code,
                    message: error.message,
                }),
                (None, None) => Err(Error::Protocol("a reply with neither ok nor error".into())),
            };
        }
    }

    fn read_line(&mut self) -> Result<ServerLine> {
        let line = read_bounded_line(&mut self.reader, MAX_REPLY_BYTES)?.ok_or_else(|| {
            Error::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the daemon closed the connection",
            ))
        })?;
        serde_json::from_slice(&line).map_err(|e| Error::Protocol(e.to_string()))
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
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let mut input = io::Cursor::new(b"one\ntwo\n\nlast".to_vec());
        assert_eq!(read_bounded_line(&mut input, 10).unwrap().unwrap(), b"one");
        assert_eq!(read_bounded_line(&mut input, 10).unwrap().unwrap(), b"two");
        assert_eq!(read_bounded_line(&mut input, 10).unwrap().unwrap(), b"");
        assert_eq!(read_bounded_line(&mut input, 10).unwrap().unwrap(), b"last");
        assert_eq!(read_bounded_line(&mut input, 10).unwrap(), None);
        let mut long = io::Cursor::new(vec![b'x'; 100]);
        assert!(read_bounded_line(&mut long, 10).is_err());
    }
}
