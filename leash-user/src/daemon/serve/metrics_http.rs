//! `leash daemon --metrics ADDR`: the daemon's figures ([`crate::daemon::metrics`]) for Prometheus, as
//! `GET /metrics` over HTTP/1.x (hyper), on a Unix socket or a loopback TCP address.
//!
//! The daemon runs as root and the endpoint has no authentication. A Unix socket is root's
//! (0600), or root's and a named group's (0660, `--metrics-group`): whoever may connect may
//! also hold the few connections served at once, and keep the scraper out. A loopback port is
//! open to every local user (the figures are counts, with no pid, uid or command in them), and
//! to nobody else. It is written for hostile clients: a request head is at most
//! 8 KiB and must come within 5 s, the response must be taken within 5 s, at most 8
//! connections are served at once (more wait in the kernel's queue), every connection is
//! closed after one response, and a request's body is never read. The figures are read at
//! most once a second, on a blocking thread, whatever the number of scrapes: a client scraping
//! in a loop costs little, and never goes through the owner thread, so it cannot delay
//! enforcement.

use std::{
    convert::Infallible,
    fmt,
    future::poll_fn,
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use hyper::{
    Method, Request, Response, StatusCode, Uri,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UnixListener, UnixStream},
    sync::{Mutex, Semaphore, oneshot},
};

use crate::daemon::{
    io::{
        accept::RateLimit,
        disposal::Disposal,
        request_stream::{Pidfds, RequestStream, Strangers},
    },
    metrics::{self, KernelCounters, ProcessFigures, Readings},
    rules::config::MetricsAddr,
    state::shared::Daemon,
};

mod status_line;
use status_line::Http11;

/// The longest request head (request line and headers) read: hyper answers a longer one with
/// 431, and reads no more of it.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a client may take to send its request head, from its connection's start.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// How long a client may take to read the response, from the moment it is ready.
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

/// Reads the figures now. Reads the kernel's maps (two lookups per tree): call it on a
/// blocking thread.
fn readings(daemon: &Daemon) -> Readings {
    // The registry's lock is held to copy the ids, as for `status`; the maps are read after.
    let (trees, leases) = (daemon.registry.trees(), daemon.registry.lease_count());
    let view = &daemon.view;
    let members = view.members_of(&trees);
    let capacity = view.capacity();
    let kernel = view.stats().ok().map(|stats| KernelCounters {
        events_dropped: stats.events_dropped,
        inserts_failed: stats.inserts_failed,
        program_skips: view.program_skips(),
        reconciled: stats.reconciled,
        forks_refused: stats.forks_refused,
    });
    Readings {
        membership: daemon.membership.as_str(),
        trees: trees.len() as u64,
        trees_capacity: capacity.trees.into(),
        members,
        members_capacity: capacity.members.into(),
        leases: leases as u64,
        kernel,
        process: ProcessFigures::read().ok(),
    }
}

/// The bound endpoint.
pub(in crate::daemon) enum Listener {
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
pub(in crate::daemon) async fn bind(addr: &MetricsAddr, group: Option<u32>) -> Result<Listener> {
    match addr {
        MetricsAddr::Unix(path) => crate::daemon::io::socket::bind(
            path,
            "--metrics",
            crate::daemon::io::socket::SocketAccess::Root { group },
        )
        .map(Listener::Unix),
        MetricsAddr::Tcp(tcp) => TcpListener::bind(tcp)
            .await
            .map(Listener::Tcp)
            .with_context(|| format!("binding --metrics {tcp}")),
    }
}

/// Serves `GET /metrics` on `listener` for as long as the daemon runs.
pub(in crate::daemon) async fn serve(listener: Listener, daemon: Arc<Daemon>) {
    let disposal = daemon.disposal.clone();
    let server = Server::new(move || daemon.metrics.encode(&readings(&daemon)));
    accept(listener, Arc::new(server), disposal).await;
}

/// Accepts connections on `listener` and serves each on a task of its own, at most
/// [`MAX_CONNECTIONS`] at once.
async fn accept(listener: Listener, server: Arc<Server>, disposal: Disposal) {
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
                let disposal = disposal.clone();
                tokio::spawn(async move {
                    server.serve_unix(stream, disposal).await;
                    drop(slot);
                });
            }),
            Listener::Tcp(listener) => listener.accept().await.map(|(stream, _)| {
                tokio::spawn(async move {
                    drop(server.serve_connection(stream).await);
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

/// Reads the figures, in the text format.
type Read = dyn Fn() -> String + Send + Sync;

struct Server {
    /// Reads the figures: on a blocking thread, as it reads the kernel's maps.
    read: Arc<Read>,
    /// The last reading of the figures, and when it was made. Held while a reading is made, so
    /// scrapes take turns (only scrapes take this lock).
    latest: Mutex<Option<(Instant, Arc<str>)>>,
}

impl Server {
    fn new(read: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self {
            read: Arc::new(read),
            latest: Mutex::new(None),
        }
    }

    /// A connection on the Unix socket. It is read with recvmsg, as the protocol's are: a
    /// plain read would have the kernel close a descriptor sent with the request right here,
    /// where its close may block (see `disposal`). HTTP takes none, and one that is not a pidfd
    /// ends the connection. Its socket is closed as the protocol's are, apart if something
    /// queued on it carries a descriptor.
    async fn serve_unix(self: Arc<Self>, stream: UnixStream, disposal: Disposal) {
        // Charged to its uid (who it is beyond that is not asked here); -1 when unknown.
        let account = stream.peer_cred().map_or(u32::MAX, |c| c.uid()).into();
        let (reader, writer) = stream.into_split();
        // Without SO_PASSCRED, no read names its sender: no host to tell strangers from (0).
        let (pidfds, strangers) = (Pidfds::default(), Strangers::default());
        let reader = RequestStream::new(reader, 0, pidfds, strangers, account, disposal.clone());
        let stream = self.serve_connection(tokio::io::join(reader, writer)).await;
        let (reader, writer) = stream.into_inner();
        let stream = reader.into_half().reunite(writer).map(UnixStream::into_std);
        match stream {
            Ok(Ok(stream)) => disposal.close_connection(account, stream.into(), None),
            // It could not be taken from tokio, and was closed there.
            _ => tracing::warn!(account, "metrics: dropping a connection"),
        }
    }

    /// One request, one response, then the connection is over, and `stream` is handed back
    /// to be closed. A client that is too slow, or goes away, is dropped without a word.
    async fn serve_connection<S>(self: Arc<Self>, stream: S) -> S
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Said when the response is ready: the client has RESPONSE_DEADLINE from then to
        // take it (hyper has no deadline on writes).
        let (answered, on_answer) = oneshot::channel();
        let answered = std::sync::Mutex::new(Some(answered));
        let service = service_fn(move |request: Request<_>| {
            let server = self.clone();
            let answered = answered
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            Box::pin(async move {
                let response = server.respond(request.method(), request.uri()).await;
                if let Some(answered) = answered {
                    let _ = answered.send(());
                }
                Ok::<_, Infallible>(response)
            })
        });
        let mut connection = builder().serve_connection(TokioIo::new(Http11::new(stream)), service);
        // The head has a deadline of hyper's; the time to read the figures is not the client's.
        let taken = async {
            let _ = on_answer.await;
            tokio::time::sleep(RESPONSE_DEADLINE).await;
        };
        tokio::select! {
            served = poll_fn(|cx| connection.poll_without_shutdown(cx)) => {
                if let Err(e) = served {
                    tracing::debug!("metrics: {e}");
                }
            }
            () = taken => {
                tracing::debug!("metrics: the response was not taken within {RESPONSE_DEADLINE:?}");
            }
        }
        let mut stream = connection.into_parts().io.into_inner().into_inner();
        // The end of the response (hyper leaves it to whoever takes the stream back). A
        // shutdown does not wait for the peer.
        let _ = stream.shutdown().await;
        stream
    }

    /// The answer to a request for `target` with `method`.
    async fn respond(&self, method: &Method, target: &Uri) -> Response<String> {
        match route(method, target) {
            Route::Metrics => match self.figures().await {
                Some(body) => response(StatusCode::OK, metrics::CONTENT_TYPE, body.to_string()),
                None => error(StatusCode::INTERNAL_SERVER_ERROR, "reading the figures"),
            },
            Route::NotFound => error(StatusCode::NOT_FOUND, &format!("only {PATH} is served")),
            Route::MethodNotAllowed => {
                let message = format!("{PATH} is read with GET (or HEAD)");
                let mut refused = error(StatusCode::METHOD_NOT_ALLOWED, &message);
                let allowed = HeaderValue::from_static("GET, HEAD");
                refused.headers_mut().insert(header::ALLOW, allowed);
                refused
            }
            Route::BadRequest => error(StatusCode::BAD_REQUEST, "the target is not a path"),
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
        let read = self.read.clone();
        let body: Arc<str> = tokio::task::spawn_blocking(move || read())
            .await
            .ok()?
            .into();
        *latest = Some((Instant::now(), body.clone()));
        Some(body)
    }
}

/// How connections are served: HTTP/1.x only, one request each.
fn builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // From the connection's start (hyper starts it as it waits for a head): a client that
        // sends nothing is dropped too.
        .header_read_timeout(REQUEST_DEADLINE)
        .max_header_size(MAX_HEAD_BYTES)
        // Its read buffer too (the least hyper takes): a body is never read.
        .max_buf_size(MAX_HEAD_BYTES)
        // One response per connection: a client cannot keep a connection, and its slot, for
        // more than one.
        .keep_alive(false)
        // A client that shuts its side down once its request is sent still gets the answer.
        .half_close(true)
        .auto_date_header(false);
    builder
}

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Where a request goes, by its method and target (hyper has read the request line, and
/// answered 400 to one it could not). A query is ignored.
fn route(method: &Method, target: &Uri) -> Route {
    // Only a path, as a client asks its server: not a proxy's URL, nor CONNECT's authority.
    if target.scheme().is_some() || target.authority().is_some() {
        return Route::BadRequest;
    }
    if target.path() != PATH {
        return Route::NotFound;
    }
    match *method {
        Method::GET | Method::HEAD => Route::Metrics,
        _ => Route::MethodNotAllowed,
    }
}

/// A response with `body`, of `content_type`, after which the connection is closed (hyper
/// cuts the body of a response to HEAD).
fn response(status: StatusCode, content_type: &'static str, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn error(status: StatusCode, message: &str) -> Response<String> {
    response(status, "text/plain; charset=utf-8", format!("{message}\n"))
}

#[cfg(test)]
mod tests;
