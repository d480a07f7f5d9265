//! The endpoint's answers and its limits, through hyper on in-memory streams (and, for the
//! cap on connections, on a loopback port). The deadlines are waited for on tokio's paused
//! clock, which moves on whenever every task waits: exact, and no real time spent.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, duplex},
    net::TcpStream,
    time::{sleep, timeout},
};

use super::*;

const FIGURES: &str = "# HELP x X.\n# TYPE x gauge\nx 1\n";
const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A runtime whose clock stands still until every task waits, then jumps to the next timer.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

fn server() -> Arc<Server> {
    Arc::new(Server::new(|| FIGURES.to_owned()))
}

/// Serves one connection that sends `request`, and returns all it got back.
async fn exchange_with(server: Arc<Server>, request: &[u8]) -> String {
    let (mut client, served) = duplex(64 * 1024);
    let serving = tokio::spawn(server.serve_connection(served));
    client.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    client.read_to_end(&mut answer).await.unwrap();
    serving.await.unwrap();
    String::from_utf8(answer).unwrap()
}

fn exchange(request: &[u8]) -> String {
    runtime().block_on(exchange_with(server(), request))
}

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
    for (method, target, expected) in [
        (Method::GET, "/metrics", Route::Metrics),
        (Method::GET, "/metrics?x=1", Route::Metrics),
        (Method::HEAD, "/metrics", Route::Metrics),
        (Method::GET, "/", Route::NotFound),
        (Method::GET, "/metrics/x", Route::NotFound),
        (Method::GET, "*", Route::NotFound),
        (Method::POST, "/other", Route::NotFound),
        (Method::POST, "/metrics", Route::MethodNotAllowed),
        (Method::DELETE, "/metrics", Route::MethodNotAllowed),
        (Method::GET, "http://x/metrics", Route::BadRequest),
        (Method::CONNECT, "x:443", Route::BadRequest),
    ] {
        let uri: Uri = target.parse().unwrap();
        assert_eq!(route(&method, &uri), expected, "{method} {target}");
    }
}

#[test]
fn answers() {
    let ok = exchange(GET);
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    let (head, body) = ok.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(head.contains(&format!("\r\ncontent-length: {}", FIGURES.len())));
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert_eq!(body, FIGURES);

    // An HTTP/1.0 client is answered as HTTP/1.1 (RFC 9110, 6.2), and without chunks.
    let old = exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(old.starts_with("HTTP/1.1 200 OK\r\n"), "{old}");
    assert!(old.ends_with(&format!("\r\n\r\n{FIGURES}")), "{old}");

    let head_only = exchange(b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(head_only.starts_with("HTTP/1.1 200 OK\r\n"), "{head_only}");
    assert!(head_only.ends_with("\r\n\r\n"), "{head_only}");

    let refused = exchange(b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
    assert!(refused.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("\r\nallow: get, head\r\n")
    );
    assert!(refused.ends_with("\r\n\r\n/metrics is read with GET (or HEAD)\n"));

    for (request, status) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], "404 Not Found"),
        (b"GET http://x/metrics HTTP/1.1\r\n\r\n", "400 Bad Request"),
        (b"POST /metrics HTTP/1.0\r\n\r\n", "405 Method Not Allowed"),
        (b"GET /metrics HTTP/2\r\n\r\n", "400 Bad Request"),
        (b"GET /metrics\r\n\r\n", "400 Bad Request"),
        (b"\x00\x01 nonsense\r\n\r\n", "400 Bad Request"),
        (b"\xff\xfe /metrics HTTP/1.1\r\n\r\n", "400 Bad Request"),
    ] {
        let answer = exchange(request);
        let expected = format!("HTTP/1.1 {status}\r\n");
        assert!(
            answer.starts_with(&expected),
            "{:?}: {answer}",
            String::from_utf8_lossy(request)
        );
    }
}

#[test]
fn heads_are_bounded() {
    // A head of exactly the limit is read; one a byte longer is refused, unread.
    let head = |len: usize| {
        let start = b"GET /metrics HTTP/1.1\r\nX: ";
        let mut head = start.to_vec();
        head.resize(len - 4, b'x');
        head.extend_from_slice(b"\r\n\r\n");
        head
    };
    assert!(exchange(&head(MAX_HEAD_BYTES)).starts_with("HTTP/1.1 200 OK\r\n"));
    let refused = exchange(&head(MAX_HEAD_BYTES + 1));
    assert!(
        refused.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{refused}"
    );
    // A head with no end: cut off at the limit, not read to its end.
    let refused = exchange(&[b'x'; 60 * 1024]);
    assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");
}

#[test]
fn one_response_per_connection() {
    let pipelined = [GET, GET].concat();
    let answer = exchange(&pipelined);
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert!(answer.ends_with(FIGURES));
}

#[test]
fn the_figures_are_read_at_most_once_a_second() {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = reads.clone();
    let server = Arc::new(Server::new(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        FIGURES.to_owned()
    }));
    runtime().block_on(async {
        for _ in 0..3 {
            assert!(exchange_with(server.clone(), GET).await.ends_with(FIGURES));
        }
        assert_eq!(reads.load(Ordering::Relaxed), 1);
        sleep(FRESH_FOR).await;
        exchange_with(server.clone(), GET).await;
        assert_eq!(reads.load(Ordering::Relaxed), 2);
    });
}

/// How long `client`'s connection lasted, from now, and what it got.
async fn until_closed(mut client: tokio::io::DuplexStream) -> (Duration, Vec<u8>) {
    let start = tokio::time::Instant::now();
    let mut got = Vec::new();
    let read = timeout(Duration::from_secs(30), client.read_to_end(&mut got)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    (start.elapsed(), got)
}

#[test]
fn clients_that_send_no_whole_head_are_dropped_in_time() {
    paused_runtime().block_on(async {
        for sent in [&b""[..], b"GET /metrics HTTP/1.1\r\nX: "] {
            let (mut client, served) = duplex(1024);
            let serving = tokio::spawn(server().serve_connection(served));
            client.write_all(sent).await.unwrap();
            let (lasted, got) = until_closed(client).await;
            assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
            assert!(
                lasted >= REQUEST_DEADLINE - Duration::from_millis(100)
                    && lasted < REQUEST_DEADLINE + Duration::from_secs(3),
                "{lasted:?}"
            );
            serving.await.unwrap();
        }
    });
}

#[test]
fn a_response_not_taken_is_dropped_in_time() {
    // More than the stream holds: the server waits on a client that does not read.
    let server = Arc::new(Server::new(|| "x 1\n".repeat(64 * 1024)));
    paused_runtime().block_on(async {
        let (mut client, served) = duplex(4096);
        let start = tokio::time::Instant::now();
        let serving = tokio::spawn(server.serve_connection(served));
        client.write_all(GET).await.unwrap();
        let served = timeout(Duration::from_secs(30), serving).await;
        assert!(matches!(served, Ok(Ok(_))), "{served:?}");
        let lasted = start.elapsed();
        assert!(
            lasted >= RESPONSE_DEADLINE && lasted < RESPONSE_DEADLINE + Duration::from_secs(3),
            "{lasted:?}"
        );
        drop(client);
    });
}

#[test]
fn at_most_eight_connections_are_served_at_once() {
    runtime().block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = tokio::spawn(accept(
            Listener::Tcp(listener),
            server(),
            Disposal::default(),
        ));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // One more waits in the kernel's queue, unanswered...
        let mut waiting = TcpStream::connect(addr).await.unwrap();
        waiting.write_all(GET).await.unwrap();
        let mut answer = Vec::new();
        let early = timeout(Duration::from_millis(500), waiting.read_to_end(&mut answer)).await;
        assert!(
            early.is_err(),
            "answered past the limit: {early:?} {answer:?}"
        );
        // ...until a slot is free.
        drop(idle.pop());
        let read = timeout(Duration::from_secs(3), waiting.read_to_end(&mut answer)).await;
        assert!(matches!(read, Ok(Ok(_))), "{read:?}");
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        serving.abort();
    });
}
