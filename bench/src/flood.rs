//! The flooding process of the hostile-load benchmark, and its handle in the benchmark.
//!
//! The flooder runs as an unprivileged uid (root is exempt from the daemon's per-uid caps) and
//! loads the daemon the way a hostile or broken client of that uid could, while the benchmark
//! times another uid's kills. The benchmark starts it as `leash-bench flood ...` under
//! `prlimit` (a thousand sockets need more descriptors than the default) and `setpriv`, and
//! drives it over its stdin and stdout, one line each way:
//!
//! - flooding modes: the flooder holds its tree (`--hold`) and says `ready`; on `go` it opens
//!   its connections, floods, and says `flooding N`; on `stop` (or the end of stdin) it stops
//!   and prints its [`Tally`] as one JSON line.
//! - `adopt`: it says `ready`; `adopt PID` registers PID with its descendants (`sent` as the
//!   request goes, then `adopted MS`, `refused CODE` or `failed WHY`); `release` lets the tree
//!   go (`released MS`); `stop` prints the tally.

use std::{
    io::{self, BufRead, ErrorKind, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use leash_client::{Client, ErrorCode, TreeOptions};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::watch,
};

/// What the flood does, as `--mode` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    /// Every connection pipelines `status` requests and reads the replies.
    Status,
    /// Every connection pipelines `list` requests and reads the replies.
    List,
    /// Every connection pipelines `list` requests and never reads a reply.
    Unread,
    /// One connection registers (adopts) an existing tree, on command.
    Adopt,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Status => "status",
            Mode::List => "list",
            Mode::Unread => "unread",
            Mode::Adopt => "adopt",
        }
    }
}

/// `leash-bench flood`: run by the benchmark itself, as the flooding uid.
#[derive(clap::Args, Debug)]
pub(crate) struct FloodArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long, value_enum)]
    mode: Mode,
    /// Connections to flood through.
    #[arg(long, default_value_t = 1000)]
    connections: usize,
    /// Register this process (and its descendants) first, and hold it while flooding.
    #[arg(long)]
    hold: Option<u32>,
}

/// What the flood's clients saw. Requests of connections that never read have no outcome.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Tally {
    /// Connections the flood tried to open.
    pub connections: u64,
    /// connect() failed (after retrying a full backlog for a while).
    pub connect_failed: u64,
    /// Connected, then closed by the daemon before any request of theirs was answered (or
    /// told `limit_reached` first).
    pub refused_connections: u64,
    /// Closed by the daemon after some of their requests were answered.
    pub closed_by_daemon: u64,
    pub sent: u64,
    pub answered: Option<u64>,
    /// Error replies `limit_reached` to a request.
    pub refused: Option<u64>,
    pub other_errors: Option<u64>,
}

/// The flooder's main: as `leash-bench flood ...`.
pub(crate) fn run(args: &FloodArgs) -> Result<()> {
    let mut commands = io::BufReader::new(io::stdin()).lines();
    let holder = match args.hold {
        Some(pid) => {
            let mut client = Client::connect_to(&args.socket)?;
            client
                .adopt(pid, &TreeOptions::default())
                .with_context(|| format!("holding the tree of {pid}"))?;
            Some(client)
        }
        None => None,
    };
    if args.mode == Mode::Adopt {
        return adopt_on_command(&args.socket, &mut commands);
    }
    say("ready")?;
    match commands.next() {
        Some(Ok(line)) if line.trim() == "go" => {}
        _ => return Ok(()),
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tally = runtime.block_on(flood(args, commands))?;
    drop(holder);
    say(&serde_json::to_string(&tally)?)
}

fn say(line: &str) -> Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// The `adopt` mode: one connection, which registers and releases on command.
fn adopt_on_command(
    socket: &Path,
    commands: &mut impl Iterator<Item = io::Result<String>>,
) -> Result<()> {
    let mut client = Client::connect_to(socket)?;
    let mut tally = Tally {
        connections: 1,
        answered: Some(0),
        refused: Some(0),
        other_errors: Some(0),
        ..Tally::default()
    };
    let mut held = None;
    say("ready")?;
    for line in commands {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["adopt", pid] => {
                let pid: u32 = pid.parse().context("adopt PID")?;
                say("sent")?;
                tally.sent += 1;
                let started = Instant::now();
                let count = |n: &mut Option<u64>| *n = Some(n.unwrap_or(0) + 1);
                match client.adopt(pid, &TreeOptions::default()) {
                    Ok(tree) => {
                        held = Some(tree);
                        count(&mut tally.answered);
                        say(&format!("adopted {:.1}", ms_since(started)))?;
                    }
                    Err(leash_client::Error::Daemon {
                        code: ErrorCode::LimitReached,
                        ..
                    }) => {
                        count(&mut tally.refused);
                        say("refused limit_reached")?;
                    }
                    Err(e) => {
                        count(&mut tally.other_errors);
                        say(&format!("failed {e}"))?;
                    }
                }
            }
            ["release"] => {
                let started = Instant::now();
                if let Some(tree) = held.take() {
                    client.release(tree)?;
                }
                say(&format!("released {:.1}", ms_since(started)))?;
            }
            _ => break,
        }
    }
    say(&serde_json::to_string(&tally)?)
}

fn ms_since(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

/// The counters every connection adds to.
#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    answered: AtomicU64,
    refused: AtomicU64,
    other_errors: AtomicU64,
}

/// How one connection ended.
#[derive(Default)]
struct Ending {
    /// The daemon closed it (end of stream, or a write refused).
    closed: bool,
    /// Something came back on it.
    heard: bool,
    /// At least one of its requests was answered.
    answered: bool,
    /// The first thing it heard was `limit_reached`.
    refused_first: bool,
}

/// Requests per write: pipelined, so the flood is bound by the daemon, not by round trips.
const BATCH: u64 = 32;

/// Opens the connections, floods until `stop` comes on stdin, and counts.
async fn flood(
    args: &FloodArgs,
    commands: impl Iterator<Item = io::Result<String>> + Send + 'static,
) -> Result<Tally> {
    let (stop, stopped) = watch::channel(false);
    let counters = Arc::new(Counters::default());
    let op = if args.mode == Mode::Status {
        "status"
    } else {
        "list"
    };
    let reads = args.mode != Mode::Unread;
    let mut tally = Tally {
        connections: args.connections as u64,
        ..Tally::default()
    };
    let mut tasks = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let Some(stream) = connect(&args.socket).await else {
            tally.connect_failed += 1;
            continue;
        };
        tasks.push(tokio::spawn(connection(
            stream,
            op,
            reads,
            stopped.clone(),
            counters.clone(),
        )));
    }
    say(&format!("flooding {} {}", tasks.len(), args.mode.name()))?;
    // Whatever the next line says (or none), the flood ends with it.
    thread::spawn(move || {
        let _ = commands.into_iter().next();
        let _ = stop.send(true);
    });
    let mut stopped_seen = stopped.clone();
    let _ = stopped_seen.wait_for(|&s| s).await;
    for task in tasks {
        // A task ends at once on stop, but for an unread connection's last look (bounded).
        let ending = match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(ending)) => ending,
            _ => Ending::default(),
        };
        if (ending.closed || ending.refused_first) && !ending.answered {
            tally.refused_connections += 1;
        } else if ending.closed {
            tally.closed_by_daemon += 1;
        }
    }
    tally.sent = counters.sent.load(Ordering::Relaxed);
    if reads {
        tally.answered = Some(counters.answered.load(Ordering::Relaxed));
        tally.refused = Some(counters.refused.load(Ordering::Relaxed));
        tally.other_errors = Some(counters.other_errors.load(Ordering::Relaxed));
    }
    Ok(tally)
}

/// Connects, retrying for a while when the daemon's accept backlog is full (a thousand
/// connections opened at once can fill it); None if the daemon refuses.
async fn connect(socket: &Path) -> Option<UnixStream> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match UnixStream::connect(socket).await {
            Ok(stream) => return Some(stream),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err(_) => return None,
        }
    }
}

/// One flooding connection: writes `op` requests until stopped, reading and classifying the
/// replies if `reads`; otherwise it never reads until the flood is over, and then only looks
/// at the first reply.
async fn connection(
    stream: UnixStream,
    op: &'static str,
    reads: bool,
    mut stopped: watch::Receiver<bool>,
    counters: Arc<Counters>,
) -> Ending {
    let (mut reader, mut writer) = stream.into_split();
    let mut ending = Ending::default();
    let mut stop_writing = stopped.clone();
    let write = async {
        let mut next_id = 1u64;
        let mut batch = String::new();
        loop {
            batch.clear();
            for id in next_id..next_id + BATCH {
                batch.push_str(&format!("{{\"id\":{id},\"op\":\"{op}\"}}\n"));
            }
            next_id += BATCH;
            tokio::select! {
                _ = stop_writing.wait_for(|&s| s) => return false,
                written = writer.write_all(batch.as_bytes()) => {
                    if written.is_err() {
                        return true;
                    }
                    counters.sent.fetch_add(BATCH, Ordering::Relaxed);
                }
            }
        }
    };
    if !reads {
        ending.closed = write.await;
        // Nothing yet (the daemon has not answered) leaves the connection open, as it was.
        let first = tokio::time::timeout(Duration::from_secs(2), first_line(&mut reader)).await;
        match first {
            Ok(Some(head)) => match classify(&head) {
                Heard::Answer => ending.answered = true,
                Heard::Refusal { .. } => ending.refused_first = true,
                Heard::OtherError => {}
            },
            Ok(None) => ending.closed = true,
            Err(_) => {}
        }
        return ending;
    }
    let read = async {
        let mut lines = LineHeads::default();
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = tokio::select! {
                _ = stopped.wait_for(|&s| s) => return false,
                n = reader.read(&mut buffer) => n,
            };
            let n = match n {
                Ok(0) | Err(_) => return true,
                Ok(n) => n,
            };
            for head in lines.feed(&buffer[..n]) {
                let heard = classify(&head);
                if !ending.heard && matches!(heard, Heard::Refusal { .. }) {
                    ending.refused_first = true;
                }
                ending.heard = true;
                let counter = match heard {
                    Heard::Answer => {
                        ending.answered = true;
                        &counters.answered
                    }
                    Heard::Refusal { to_request: true } => &counters.refused,
                    // The connection's own refusal: counted with the connections.
                    Heard::Refusal { to_request: false } => continue,
                    Heard::OtherError => &counters.other_errors,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    let (write_closed, read_closed) = tokio::join!(write, read);
    ending.closed = write_closed || read_closed;
    ending
}

/// Reads up to the end of the first line (keeping its head); None if the stream ends first.
async fn first_line(reader: &mut (impl AsyncReadExt + Unpin)) -> Option<Vec<u8>> {
    let mut lines = LineHeads::default();
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = reader.read(&mut buffer).await.ok().filter(|&n| n > 0)?;
        if let Some(head) = lines.feed(&buffer[..n]).into_iter().next() {
            return Some(head);
        }
    }
}

/// The first bytes of each line of a stream fed in chunks: enough to tell a reply's kind
/// without holding a `list` reply of megabytes.
#[derive(Default)]
struct LineHeads {
    head: Vec<u8>,
}

impl LineHeads {
    const KEEP: usize = 160;

    /// The heads of the lines that end in `chunk`.
    fn feed(&mut self, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut done = Vec::new();
        for part in chunk.split_inclusive(|&b| b == b'\n') {
            let (body, ends) = match part.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (part, false),
            };
            let room = Self::KEEP.saturating_sub(self.head.len());
            self.head.extend_from_slice(&body[..body.len().min(room)]);
            if ends {
                done.push(std::mem::take(&mut self.head));
            }
        }
        done
    }
}

/// What one line from the daemon says.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Answer,
    /// `limit_reached`: to a request (it carries an id) or to the connection itself.
    Refusal {
        to_request: bool,
    },
    OtherError,
}

/// Tells a reply's kind from its head (`{"id":N,"ok":...}` or `{"id":N,"error":{"code":...}}`;
/// a refusal of the connection itself may carry no id).
fn classify(head: &[u8]) -> Heard {
    let text = String::from_utf8_lossy(head);
    let error = text.find("\"error\"");
    let ok = text.find("\"ok\"");
    match (error, ok) {
        (Some(e), Some(o)) if o < e => Heard::Answer,
        (Some(_), _) if text.contains("\"limit_reached\"") => Heard::Refusal {
            to_request: text.starts_with("{\"id\""),
        },
        (Some(_), _) => Heard::OtherError,
        _ => Heard::Answer,
    }
}

/// The benchmark's handle on a running flooder: its commands in, its lines out (read on a
/// thread of their own, so that every wait has a deadline). Dropping it kills the flooder.
pub(crate) struct Flooder {
    process: Child,
    commands: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Flooder {
    /// Starts `binary flood` as `uid`, with descriptors for a thousand sockets, and waits for
    /// it to be ready (its tree held, if `hold`).
    pub(crate) fn start(
        binary: &Path,
        socket: &Path,
        uid: u32,
        mode: Mode,
        connections: usize,
        hold: Option<u32>,
    ) -> Result<Self> {
        let mut command = Command::new("prlimit");
        command
            .arg("--nofile=8192:8192")
            .arg("setpriv")
            .args(leash_tests::daemon::setpriv_args(uid))
            .arg(binary)
            .arg("flood")
            .arg("--socket")
            .arg(socket)
            .args(["--mode", mode.name()])
            .args(["--connections", &connections.to_string()])
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(pid) = hold {
            command.args(["--hold", &pid.to_string()]);
        }
        let mut process = command.spawn().context("starting the flooder")?;
        let commands = process.stdin.take();
        let stdout = process.stdout.take().context("the flooder's stdout")?;
        let (send, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut flooder = Self {
            process,
            commands,
            lines,
        };
        flooder.expect("ready", Duration::from_secs(120))?;
        Ok(flooder)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.process.id()
    }

    pub(crate) fn send(&mut self, command: &str) -> Result<()> {
        let commands = self.commands.as_mut().context("the flooder was stopped")?;
        writeln!(commands, "{command}").context("commanding the flooder")?;
        commands.flush()?;
        Ok(())
    }

    /// The flooder's next line.
    pub(crate) fn next_line(&mut self, timeout: Duration) -> Result<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("the flooder said nothing in {timeout:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the flooder ended"),
        }
    }

    /// The flooder's next line if it has said one; never waits.
    pub(crate) fn try_line(&mut self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// The flooder's next line, which must start with `word`; the rest of it.
    pub(crate) fn expect(&mut self, word: &str, timeout: Duration) -> Result<String> {
        let line = self
            .next_line(timeout)
            .with_context(|| format!("waiting for {word:?}"))?;
        match line.strip_prefix(word) {
            Some(rest) => Ok(rest.trim().to_owned()),
            None => bail!("the flooder said {line:?}, not {word:?}"),
        }
    }

    /// Ends the flood, and its connections with it; what its clients saw.
    pub(crate) fn finish(mut self) -> Result<Tally> {
        // The end of its stdin is its stop command.
        drop(self.commands.take());
        let deadline = Duration::from_secs(60);
        let line = self
            .lines
            .recv_timeout(deadline)
            .context("the flooder gave no tally")?;
        let tally = serde_json::from_str(&line)
            .with_context(|| format!("the flooder's tally: {line:?}"))?;
        let exited = leash_tests::wait_for(Duration::from_secs(10), || {
            self.process.try_wait().ok().flatten().is_some()
        });
        if !exited {
            bail!("the flooder did not exit after its tally");
        }
        Ok(tally)
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        // Killed by its pid, which stays its own until it is reaped here.
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_heads_follow_lines_across_chunks() {
        let mut lines = LineHeads::default();
        assert!(lines.feed(b"{\"id\":1,\"ok\"").is_empty());
        let long = "x".repeat(1000);
        let heads = lines.feed(format!(":{long}\n{{\"id\":2}}\n{{").as_bytes());
        assert_eq!(heads.len(), 2);
        assert_eq!(heads[0].len(), LineHeads::KEEP);
        assert!(heads[0].starts_with(b"{\"id\":1,\"ok\":xx"));
        assert_eq!(heads[1], b"{\"id\":2}");
        assert_eq!(lines.feed(b"}\n"), vec![b"{}".to_vec()]);
    }

    #[test]
    fn replies_are_told_apart() {
        assert_eq!(
            classify(br#"{"id":3,"ok":{"status":{"daemon_version":"0.1.0"}}}"#),
            Heard::Answer
        );
        assert_eq!(
            classify(br#"{"id":3,"error":{"code":"limit_reached","message":"uid"#),
            Heard::Refusal { to_request: true }
        );
        assert_eq!(
            classify(br#"{"error":{"code":"limit_reached","message":"too many"}}"#),
            Heard::Refusal { to_request: false }
        );
        assert_eq!(
            classify(br#"{"id":4,"error":{"code":"internal","message":"x"}}"#),
            Heard::OtherError
        );
        // A list whose members' text says "error" is still an answer.
        assert_eq!(
            classify(br#"{"id":5,"ok":{"trees":[{"comm":"\"error\""}]}}"#),
            Heard::Answer
        );
    }
}
