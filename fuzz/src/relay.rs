//! The only way the `connection` target reaches the daemon: a child process that runs as
//! [`RELAY_UID`], an unprivileged uid, and makes each connection on the harness's behalf.
//!
//! The daemon decides what a client may do by the credentials of the process that connected.
//! The harness runs as root (the daemon needs it), and a fuzzed `register` or `kill` sent on a
//! root connection could signal any process on the machine. From the relay's uid, the only
//! processes within reach are the relay and its own children.
//!
//! Harness and relay speak over the relay's stdin and stdout: a job is a length (u32, little
//! endian) and the bytes to send; the answer is how the conversation ended (one byte), a length
//! and the bytes the daemon sent.

use std::{
    env,
    io::{self, Read, Write},
    net::Shutdown,
    os::unix::{net::UnixStream, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::credentials::Credentials;

pub(crate) const ROLE: &str = "relay";
const SOCKET_VAR: &str = "LEASH_FUZZ_SOCKET";

/// The relay's uid and gid: not root, and no uid the tests use (61001, 61002).
pub const RELAY_UID: u32 = 61003;
/// Each `$CHILD` in a connection's input becomes the pid of a fresh child of the relay (a
/// `cat` that reads a pipe from the relay, so it ends when the relay does), so that fuzzed
/// requests can register, list and kill real processes. The children are killed and reaped
/// when the conversation is over.
pub const CHILD_PLACEHOLDER: &[u8] = b"$CHILD";
/// Children per conversation; further `$CHILD`s name the last one.
const MAX_CHILDREN: usize = 4;
/// How long the daemon has to close a connection once the client has half-closed it.
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(20);
/// The most a conversation may bring back: far more than any input of the fuzzer's can ask for.
pub const MAX_OUTPUT: usize = 64 << 20;

/// How a conversation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The daemon closed the connection after its last line.
    Closed,
    /// The daemon closed it with some of the input unread (a client that floods it is
    /// disconnected).
    Reset,
    /// The daemon did not close it within [`CLOSE_DEADLINE`].
    Deadline,
    /// The daemon sent more than [`MAX_OUTPUT`].
    TooMuch,
    /// No connection: the output is the error.
    ConnectFailed,
}

impl Ending {
    const ALL: [Ending; 5] = [
        Ending::Closed,
        Ending::Reset,
        Ending::Deadline,
        Ending::TooMuch,
        Ending::ConnectFailed,
    ];

    fn code(self) -> u8 {
        Self::ALL.iter().position(|&e| e == self).unwrap_or(0) as u8
    }

    fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }
}

/// One connection's worth: how it ended and everything the daemon sent.
#[derive(Debug)]
pub struct Conversation {
    pub ending: Ending,
    pub output: Vec<u8>,
}

/// The harness's end of a relay process.
pub struct Relay {
    to: ChildStdin,
    from: ChildStdout,
    process: Child,
}

impl Relay {
    /// Starts a relay for the daemon at `socket`, and checks that it runs as [`RELAY_UID`]
    /// and nothing else; panics if it does not, since fuzzing on would send fuzzed requests
    /// with privileges.
    pub fn start(socket: &Path) -> Self {
        let mut process = Command::new("/proc/self/exe")
            .env(crate::ROLE_VAR, ROLE)
            .env(SOCKET_VAR, socket)
            // As root, std also drops every supplementary group (setgroups) before these.
            .uid(RELAY_UID)
            .gid(RELAY_UID)
            // Out of the terminal's process group: Ctrl-C ends the harness, and the relay
            // follows when its stdin closes.
            .process_group(0)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the relay");
        // std returns once the relay has exec'd, after it changed uids: these are final.
        let credentials = Credentials::of(&process.id().to_string());
        if !credentials
            .as_ref()
            .is_ok_and(|c| c.are_only(RELAY_UID) && !c.uids.contains(&0))
        {
            let _ = process.kill();
            let _ = process.wait();
            panic!("the relay must run as uid {RELAY_UID} only, and has {credentials:?}");
        }
        let to = process.stdin.take().expect("the relay's stdin is piped");
        let from = process.stdout.take().expect("the relay's stdout is piped");
        Self { to, from, process }
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Has the relay open a connection, send `input`, half-close, and bring back the answer.
    /// An error means the relay is gone.
    pub fn converse(&mut self, input: &[u8]) -> io::Result<Conversation> {
        write_frame(&mut self.to, input)?;
        self.to.flush()?;
        let mut code = [0u8];
        self.from.read_exact(&mut code)?;
        let ending = Ending::from_code(code[0]).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "the relay sent no ending")
        })?;
        let output = read_frame(&mut self.from)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        Ok(Conversation { ending, output })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Its children end with it: their stdin is a pipe from it.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The relay process: refuses to run as anything but [`RELAY_UID`], then makes one connection
/// per job until the harness closes its stdin.
pub(crate) fn serve() -> ! {
    match Credentials::of("self") {
        Ok(me) if me.are_only(RELAY_UID) => {}
        me => {
            eprintln!("leash fuzz relay: refusing to run as {me:?}, not uid {RELAY_UID} only");
            std::process::exit(3);
        }
    }
    let Some(socket) = env::var_os(SOCKET_VAR).map(PathBuf::from) else {
        eprintln!("leash fuzz relay: {SOCKET_VAR} is not set");
        std::process::exit(2);
    };
    let mut jobs = io::stdin().lock();
    let mut answers = io::stdout().lock();
    loop {
        let input = match read_frame(&mut jobs) {
            Ok(Some(input)) => input,
            _ => std::process::exit(0),
        };
        let mut children = Vec::new();
        let input = with_children(&input, &mut children);
        let conversation = converse(&socket, input);
        for child in children {
            end_child(child);
        }
        let sent = answers
            .write_all(&[conversation.ending.code()])
            .and_then(|()| write_frame(&mut answers, &conversation.output))
            .and_then(|()| answers.flush());
        if sent.is_err() {
            std::process::exit(0);
        }
    }
}

/// `input` with each [`CHILD_PLACEHOLDER`] replaced by the pid of a new child (kept in
/// `children`).
fn with_children(input: &[u8], children: &mut Vec<(Child, ChildStdin)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest
        .windows(CHILD_PLACEHOLDER.len())
        .position(|window| window == CHILD_PLACEHOLDER)
    {
        out.extend_from_slice(&rest[..at]);
        if children.len() < MAX_CHILDREN
            && let Ok(mut child) = Command::new("cat")
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
        {
            let stdin = child.stdin.take().expect("piped");
            children.push((child, stdin));
        }
        let pid = children.last().map_or(0, |(child, _)| child.id());
        out.extend_from_slice(pid.to_string().as_bytes());
        rest = &rest[at + CHILD_PLACEHOLDER.len()..];
    }
    out.extend_from_slice(rest);
    out
}

fn end_child((mut child, stdin): (Child, ChildStdin)) {
    drop(stdin);
    // Not reaped yet, so the pid is still this child's.
    let _ = child.kill();
    let _ = child.wait();
}

/// One connection: writes `input` a line at a time while reading, half-closes, and reads
/// until the daemon closes (or the deadline).
fn converse(socket: &Path, input: Vec<u8>) -> Conversation {
    let failed = |e: io::Error| Conversation {
        ending: Ending::ConnectFailed,
        output: e.to_string().into_bytes(),
    };
    let stream = match UnixStream::connect(socket) {
        Ok(stream) => stream,
        Err(e) => return failed(e),
    };
    let mut writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(e) => return failed(e),
    };
    // Writing and reading at once: a daemon that answers while it reads must never wait on
    // a client that is still writing.
    let writing = thread::spawn(move || {
        for line in input.split_inclusive(|&b| b == b'\n') {
            if writer.write_all(line).is_err() {
                return;
            }
        }
        let _ = writer.shutdown(Shutdown::Write);
    });
    let deadline = Instant::now() + CLOSE_DEADLINE;
    let mut output = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let ending = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Ending::Deadline;
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            break Ending::Reset;
        }
        match (&stream).read(&mut chunk) {
            Ok(0) => break Ending::Closed,
            Ok(n) if output.len() + n > MAX_OUTPUT => break Ending::TooMuch,
            Ok(n) => output.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break Ending::Reset,
        }
    };
    // Unblocks the writer if the daemon stopped reading.
    let _ = stream.shutdown(Shutdown::Both);
    let _ = writing.join();
    Conversation { ending, output }
}

fn write_frame(to: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    let len = u32::try_from(bytes.len()).map_err(|_| io::Error::other("frame too long"))?;
    to.write_all(&len.to_le_bytes())?;
    to.write_all(bytes)
}

/// One frame; None at a clean end of the stream.
fn read_frame(from: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match from.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
    from.read_exact(&mut bytes)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_survive_the_pipe() {
        for ending in Ending::ALL {
            assert_eq!(Ending::from_code(ending.code()), Some(ending));
        }
        assert_eq!(Ending::from_code(200), None);
    }

    #[test]
    fn frames_survive_the_pipe() {
        let mut pipe = Vec::new();
        write_frame(&mut pipe, b"one\n").unwrap();
        write_frame(&mut pipe, b"").unwrap();
        let mut from = &pipe[..];
        assert_eq!(read_frame(&mut from).unwrap().unwrap(), b"one\n");
        assert_eq!(read_frame(&mut from).unwrap().unwrap(), b"");
        assert!(read_frame(&mut from).unwrap().is_none());
    }

    #[test]
    fn each_placeholder_is_a_child_of_the_relay() {
        let mut children = Vec::new();
        let out = with_children(br#"{"pid":$CHILD}{"pid":$CHILD"#, &mut children);
        assert_eq!(children.len(), 2);
        let (a, b) = (children[0].0.id(), children[1].0.id());
        assert_eq!(out, format!(r#"{{"pid":{a}}}{{"pid":{b}"#).into_bytes());
        for child in children {
            end_child(child);
        }
        assert_eq!(
            with_children(b"no placeholder", &mut Vec::new()),
            b"no placeholder"
        );
    }
}
