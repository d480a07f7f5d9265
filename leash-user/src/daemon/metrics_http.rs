//! `leash daemon --metrics ADDR`: the daemon's figures ([`super::metrics`]) for Prometheus, as
//! `GET /metrics` over HTTP/1.x, on a Unix socket or a loopback TCP address.
//!
//! The daemon runs as root and the endpoint has no authentication. A Unix socket is root's
//! (0600), or root's and a named group's (0660, `--metrics-group`): whoever may connect may
//! also hold the few connections served at once, and keep the scraper out. A loopback port is
//! open to every local user (the figures are counts, with no pid, uid or command in them), and
//! to nobody else. It is written for hostile clients: a request head is at most
//! 8 KiB and must come within 5 s, the response must be taken within 5 s, at most 8
//! connections are served at once (more wait in the kernel's queue), and every connection is
//! closed after one response. The figures are read at most once a second, on a blocking
//! thread, whatever the number of scrapes: a client scraping in a loop costs little, and never
//! goes through the owner thread, so it cannot delay enforcement.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UnixListener, UnixStream},
    sync::{Mutex, Semaphore},
    time::timeout,
};

use super::{
    accept::RateLimit,
    metrics,
    metrics_text::CONTENT_TYPE,
    request_stream::{Pidfds, RequestStream, Strangers},
    shared::Daemon,
};

/// The longest request head (request line and headers) read.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a client may take to send its request head.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to read the response.
const RESPONSE_DEADLINE: Duration = Duration::from_secs(5);
/// Connections served at once.
const MAX_CONNECTIONS: usize = 8;
/// How long a reading of the figures is served again before it is read anew.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// The pause after a failed accept (out of descriptors, say), so a failure that lasts does
/// not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// The path served.
const PATH: &str = "/metrics";

/// Where the metrics are served: `--metrics ADDR`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAddr {
    /// A Unix socket at this absolute path.
    Unix(PathBuf),
    /// A loopback TCP address.
    Tcp(SocketAddr),
}

impl FromStr for MetricsAddr {
    type Err = String;

    fn from_str(addr: &str) -> Result<Self, String> {
        if addr.starts_with('/') {
            return Ok(Self::Unix(PathBuf::from(addr)));
        }
        match addr.parse::<SocketAddr>() {
            Ok(tcp) if tcp.ip().is_loopback() => Ok(Self::Tcp(tcp)),
            Ok(tcp) => Err(format!(
                "{tcp} is not a loopback address: the metrics endpoint has no authentication, \
                 so it listens only on 127.0.0.1, [::1] or a Unix socket; let a scraper on this \
                 machine (a Prometheus agent, or a proxy) carry the figures further"
            )),
            Err(_) => Err(format!(
                "{addr:?} is neither an absolute path (a Unix socket, e.g. \
                 /run/leash/metrics.sock) nor a loopback IP address with a port (e.g. \
                 127.0.0.1:9464 or [::1]:9464)"
            )),
        }
    }
}

impl fmt::Display for MetricsAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unix(path) => write!(f, "{}", path.display()),
            Self::Tcp(addr) => write!(f, "{addr}"),
        }
    }
}

impl MetricsAddr {
    /// The socket file, for a Unix socket: the daemon removes it when it stops.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Self::Unix(path) => Some(path),
            Self::Tcp(_) => None,
        }
    }
}

/// The bound endpoint.
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl fmt::Display for Listener {
    /// Where it listens (for a TCP port 0, the port the kernel chose).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let local = match self {
            Self::Unix(listener) => listener
                .local_addr()
                .ok()
                .and_then(|addr| addr.as_pathname().map(|p| p.display().to_string())),
            Self::Tcp(listener) => listener.local_addr().ok().map(|addr| addr.to_string()),
        };
        f.write_str(local.as_deref().unwrap_or("?"))
    }
}

/// Binds `addr`, or says why not: a Unix socket as the daemon's own socket is (its directory
/// root's alone, a stale socket replaced, a live one refused), but 0600 root's, or 0660 with
/// `group`: a user who may connect may also hold the few connections served at once, and so
/// keep the scraper out. A TCP address that is in use is refused.
pub async fn bind(addr: &MetricsAddr, group: Option<u32>) -> Result<Listener> {
    match addr {
        MetricsAddr::Unix(path) => super::socket::bind(
            path,
            "--metrics",
            super::socket::SocketAccess::Root { group },
        )
        .map(Listener::Unix),
        MetricsAddr::Tcp(tcp) => TcpListener::bind(tcp)
            .await
            .map(Listener::Tcp)
            .with_context(|| format!("binding --metrics {tcp}")),
    }
}

/// Serves `GET /metrics` on `listener` for as long as the daemon runs.
pub async fn serve(listener: Listener, daemon: Arc<Daemon>) {
    let server = Arc::new(Server {
        daemon,
        latest: Mutex::new(None),
    });
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut failures = RateLimit::default();
    loop {
        // A slot first: past the limit, connections wait in the kernel's queue.
        let Ok(slot) = connections.clone().acquire_owned().await else {
            return;
        };
        let server = server.clone();
        let accepted = match &listener {
            Listener::Unix(listener) => listener.accept().await.map(|(stream, _)| {
                tokio::spawn(async move {
                    server.serve_unix(stream).await;
                    drop(slot);
                });
            }),
            Listener::Tcp(listener) => listener.accept().await.map(|(stream, _)| {
                tokio::spawn(async move {
                    server.serve_connection(stream).await;
                    drop(slot);
                });
            }),
        };
        if let Err(e) = accepted {
            if let Some(count) = failures.failed(Instant::now()) {
                tracing::warn!(
                    failures = count,
                    "metrics: accept failed: {e} (at most one line every 10 s)"
                );
            }
            tokio::time::sleep(ACCEPT_PAUSE).await;
        }
    }
}

struct Server {
    daemon: Arc<Daemon>,
    /// The last reading of the figures, and when it was made. Held while a reading is made, so
    /// scrapes take turns (only scrapes take this lock).
    latest: Mutex<Option<(Instant, Arc<str>)>>,
}

impl Server {
    /// A connection on the Unix socket. It is read with recvmsg, as the protocol's are: a
    /// plain read would have the kernel close a descriptor sent with the request right here,
    /// where its close may block (see `disposal`). HTTP takes none, and one that is not a pidfd
    /// ends the connection. Its socket is closed as the protocol's are, apart if something
    /// queued on it carries a descriptor.
    async fn serve_unix(&self, stream: UnixStream) {
        // Charged to its uid (who it is beyond that is not asked here); -1 when unknown.
        let account = stream.peer_cred().map_or(u32::MAX, |c| c.uid()).into();
        let disposal = self.daemon.disposal.clone();
        let (reader, writer) = stream.into_split();
        // Without SO_PASSCRED, no read names its sender: no host to tell strangers from (0).
        let (pidfds, strangers) = (Pidfds::default(), Strangers::default());
        let reader = RequestStream::new(reader, 0, pidfds, strangers, account, disposal.clone());
        let mut stream = tokio::io::join(reader, writer);
        self.serve_connection(&mut stream).await;
        let (reader, writer) = stream.into_inner();
        let stream = reader.into_half().reunite(writer).map(UnixStream::into_std);
        match stream {
            Ok(Ok(stream)) => disposal.close_connection(account, stream.into(), None),
            // It could not be taken from tokio, and was closed there.
            _ => tracing::warn!(account, "metrics: dropping a connection"),
        }
    }

    /// One request, one response, then the connection is closed. A client that is too slow,
    /// or goes away, is dropped without a word.
    async fn serve_connection(&self, mut stream: impl AsyncRead + AsyncWrite + Unpin) {
        let head = match timeout(REQUEST_DEADLINE, read_head(&mut stream, MAX_REQUEST_BYTES)).await
        {
            Ok(Ok(head)) => head,
            Ok(Err(e)) => {
                tracing::debug!("metrics: reading a request: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!("metrics: no complete request within {REQUEST_DEADLINE:?}");
                return;
            }
        };
        let response = match head {
            Head::Ended => return,
            Head::TooLarge => Response::error(
                431,
                "Request Header Fields Too Large",
                &format!("a request head is at most {MAX_REQUEST_BYTES} bytes"),
            ),
            Head::Complete(head) => match route(&head) {
                Route::Metrics { head_only } => match self.figures().await {
                    Some(body) => Response::ok(&body, head_only),
                    None => Response::error(500, "Internal Server Error", "reading the figures"),
                },
                Route::NotFound => {
                    Response::error(404, "Not Found", &format!("only {PATH} is served"))
                }
                Route::MethodNotAllowed => Response::error(
                    405,
                    "Method Not Allowed",
                    &format!("{PATH} is read with GET (or HEAD)"),
                ),
                Route::BadRequest => {
                    Response::error(400, "Bad Request", "not an HTTP/1.x request line")
                }
            },
        };
        let sent = timeout(RESPONSE_DEADLINE, async {
            stream.write_all(&response.0).await?;
            stream.shutdown().await
        })
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!("metrics: the response was not taken");
        }
    }

    /// The figures in the text format: the last reading if it is fresh, else a new one.
    async fn figures(&self) -> Option<Arc<str>> {
        let mut latest = self.latest.lock().await;
        if let Some((at, body)) = latest.as_ref()
            && at.elapsed() < FRESH_FOR
        {
            return Some(body.clone());
        }
        let daemon = self.daemon.clone();
        let body: Arc<str> =
            tokio::task::spawn_blocking(move || metrics::encode(&metrics::snapshot(&daemon)))
                .await
                .ok()?
                .into();
        *latest = Some((Instant::now(), body.clone()));
        Some(body)
    }
}

/// What a client sent before its request head ended.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// The request line and headers, through the blank line that ends them.
    Complete(Vec<u8>),
    /// No blank line within the limit.
    TooLarge,
    /// The client closed the connection first.
    Ended,
}

/// Reads a request head of at most `max` bytes. Anything after the head (a body, a pipelined
/// request) is not looked at.
async fn read_head(stream: &mut (impl AsyncRead + Unpin), max: usize) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = end_of_head(&head) {
            head.truncate(end);
            return Ok(Head::Complete(head));
        }
        if head.len() >= max {
            return Ok(Head::TooLarge);
        }
        let room = (max - head.len()).min(chunk.len());
        let read = stream.read(&mut chunk[..room]).await?;
        if read == 0 {
            return Ok(Head::Ended);
        }
        head.extend_from_slice(&chunk[..read]);
    }
}

/// Where the head ends: after the first empty line (CRLF CRLF, or bare LFs, which HTTP
/// allows a server to accept).
fn end_of_head(bytes: &[u8]) -> Option<usize> {
    bytes
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == b'\n')
        .find_map(|(i, _)| match bytes.get(i + 1..) {
            Some([b'\n', ..]) => Some(i + 2),
            Some([b'\r', b'\n', ..]) => Some(i + 3),
            _ => None,
        })
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Metrics { head_only: bool },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Reads the request line of `head` (`METHOD TARGET HTTP/1.x`); headers are not needed.
fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else {
        return Route::BadRequest;
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    let is_token = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
    let http_1 = version
        .strip_prefix("HTTP/1.")
        .is_some_and(|minor| minor.len() == 1 && minor.bytes().all(|b| b.is_ascii_digit()));
    if !is_token(method) || !http_1 || !target.starts_with('/') || !is_token(target) {
        return Route::BadRequest;
    }
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if path != PATH {
        return Route::NotFound;
    }
    match method {
        "GET" => Route::Metrics { head_only: false },
        "HEAD" => Route::Metrics { head_only: true },
        _ => Route::MethodNotAllowed,
    }
}

/// A whole response, head and body.
struct Response(Vec<u8>);

impl Response {
    fn ok(body: &str, head_only: bool) -> Self {
        Self::new(200, "OK", CONTENT_TYPE, "", body, head_only)
    }

    fn error(status: u16, reason: &str, message: &str) -> Self {
        let extra = if status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let body = format!("{message}\n");
        Self::new(
            status,
            reason,
            "text/plain; charset=utf-8",
            extra,
            &body,
            false,
        )
    }

    fn new(
        status: u16,
        reason: &str,
        content_type: &str,
        extra_headers: &str,
        body: &str,
        head_only: bool,
    ) -> Self {
        let mut bytes = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
             {extra_headers}Connection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        if !head_only {
            bytes.extend_from_slice(body.as_bytes());
        }
        Self(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            "/run/leash/metrics.sock".parse(),
            Ok(MetricsAddr::Unix("/run/leash/metrics.sock".into()))
        );
        assert_eq!(
            "127.0.0.1:9464".parse(),
            Ok(MetricsAddr::Tcp("127.0.0.1:9464".parse().unwrap()))
        );
        assert_eq!(
            "[::1]:9464".parse(),
            Ok(MetricsAddr::Tcp("[::1]:9464".parse().unwrap()))
        );
        assert_eq!(
            "127.3.2.1:0".parse(),
            Ok(MetricsAddr::Tcp("127.3.2.1:0".parse().unwrap()))
        );
        for open in [
            "0.0.0.0:9464",
            "[::]:9464",
            "192.168.1.2:9464",
            "[::ffff:127.0.0.1]:1",
        ] {
            let refused = open.parse::<MetricsAddr>().unwrap_err();
            assert!(
                refused.contains("not a loopback address"),
                "{open}: {refused}"
            );
            assert!(refused.contains("no authentication"), "{open}: {refused}");
        }
        for unclear in ["metrics.sock", "localhost:9464", "127.0.0.1", ":9464", ""] {
            let refused = unclear.parse::<MetricsAddr>().unwrap_err();
            assert!(
                refused.contains("neither an absolute path"),
                "{unclear}: {refused}"
            );
        }
    }

    #[test]
    fn requests_are_routed() {
        let metrics = Route::Metrics { head_only: false };
        for (head, expected) in [
            (&b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"[..], metrics),
            (b"GET /metrics HTTP/1.0\r\n\r\n", metrics),
            (b"GET /metrics?x=1 HTTP/1.1\n\n", metrics),
            (
                b"HEAD /metrics HTTP/1.1\r\n\r\n",
                Route::Metrics { head_only: true },
            ),
            (b"GET / HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"GET /metrics/x HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"POST /other HTTP/1.1\r\n\r\n", Route::NotFound),
            (b"POST /metrics HTTP/1.1\r\n\r\n", Route::MethodNotAllowed),
            (b"DELETE /metrics HTTP/1.1\r\n\r\n", Route::MethodNotAllowed),
            (b"GET /metrics HTTP/2\r\n\r\n", Route::BadRequest),
            (b"GET /metrics HTTP/1.10\r\n\r\n", Route::BadRequest),
            (b"GET /metrics\r\n\r\n", Route::BadRequest),
            (b"GET  /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"GET http://x/metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"GET /metrics HTTP/1.1 x\r\n\r\n", Route::BadRequest),
            (b"\xff\xfe /metrics HTTP/1.1\r\n\r\n", Route::BadRequest),
            (b"\r\n\r\n", Route::BadRequest),
            (b"", Route::BadRequest),
        ] {
            assert_eq!(route(head), expected, "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn the_head_ends_at_the_first_empty_line() {
        let head = b"GET / HTTP/1.1\r\nA: b\r\n\r\n";
        assert_eq!(
            end_of_head(&[&head[..], b"body"].concat()),
            Some(head.len())
        );
        let bare = b"GET / HTTP/1.1\n\n";
        assert_eq!(
            end_of_head(&[&bare[..], b"body\n\n"].concat()),
            Some(bare.len())
        );
        assert_eq!(end_of_head(b"GET / HTTP/1.1\r\nA: b\r\n"), None);
        assert_eq!(end_of_head(b"\n"), None);
        assert_eq!(end_of_head(b""), None);
    }

    fn read(input: &[u8], max: usize) -> Head {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut input = input;
        runtime.block_on(read_head(&mut input, max)).unwrap()
    }

    #[test]
    fn heads_are_bounded() {
        let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(read(request, 8192), Head::Complete(request.to_vec()));
        // What follows the head is left unread.
        let mut pipelined = request.to_vec();
        pipelined.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(read(&pipelined, 8192), Head::Complete(request.to_vec()));
        // A head that just fits, and one a byte longer.
        assert_eq!(
            read(request, request.len()),
            Head::Complete(request.to_vec())
        );
        assert_eq!(read(request, request.len() - 1), Head::TooLarge);
        assert_eq!(read(&vec![b'x'; 1 << 20], 8192), Head::TooLarge);
        assert_eq!(read(b"GET /metrics HTTP/1.1\r\n", 8192), Head::Ended);
        assert_eq!(read(b"", 8192), Head::Ended);
    }

    fn text(response: &Response) -> String {
        String::from_utf8(response.0.clone()).unwrap()
    }

    #[test]
    fn responses() {
        let ok = text(&Response::ok("a 1\n", false));
        assert_eq!(
            ok,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: 4\r\nConnection: close\r\n\r\na 1\n"
        );
        let head = text(&Response::ok("a 1\n", true));
        assert!(head.ends_with("Content-Length: 4\r\nConnection: close\r\n\r\n"));
        let refused = text(&Response::error(405, "Method Not Allowed", "no"));
        assert!(refused.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
        assert!(refused.contains("\r\nAllow: GET, HEAD\r\n"));
        assert!(refused.ends_with("\r\n\r\nno\n"));
    }
}
