//! The client against a daemon played by the test: replies, events, closings, lines and
//! tokens.

use std::io::Read;

use super::*;

/// A client on one end of a socket pair, as if past its hello, and the daemon's end.
fn client_and_daemon() -> (Client, UnixStream) {
    let (client, daemon) = UnixStream::pair().unwrap();
    let client = Client {
        reader: BufReader::new(client.try_clone().unwrap()),
        writer: client,
        next_id: 1,
        events: VecDeque::new(),
        lease: LeaseInfo {
            id: 7,
            token: String::new(),
        },
        socket: PathBuf::new(),
        closing: None,
    };
    (client, daemon)
}

#[test]
fn a_closed_connection_says_what_the_daemon_said_of_the_trees() {
    let (mut client, mut daemon) = client_and_daemon();
    daemon
        .write_all(
            b"{\"event\":{\"kind\":\"closing\",\"tree\":0,\"lease\":7,\"reason\":\"shutdown\"}}\n",
        )
        .unwrap();
    drop(daemon);
    // The request cannot be sent: the lines before the close say why.
    let error = client.status().unwrap_err();
    assert!(
        matches!(error, Error::Closed(Some(ClosingReason::Shutdown))),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("killed this lease's trees"),
        "{error}"
    );
    let event = client.next_event(None).unwrap().unwrap();
    assert_eq!(event.kind, EventKind::Closing);

    let (mut client, mut daemon) = client_and_daemon();
    let closing = Event::closing(7, ClosingReason::HandOver);
    let mut line = serde_json::to_vec(&ServerLine::event(closing)).unwrap();
    line.push(b'\n');
    daemon.write_all(&line).unwrap();
    drop(daemon);
    assert_eq!(
        client.next_event(None).unwrap().unwrap().kind,
        EventKind::Closing
    );
    let error = client.next_event(None).unwrap_err();
    assert!(error.to_string().contains("stay enforced"), "{error}");

    // No word: it cannot tell.
    let (mut client, daemon) = client_and_daemon();
    drop(daemon);
    let error = client.list().unwrap_err();
    assert!(matches!(error, Error::Closed(None)), "{error:?}");
    assert!(error.to_string().contains("without a reason"), "{error}");
}

#[test]
fn a_refused_stranger_is_an_event_and_the_request_still_gets_its_reply() {
    let (mut client, daemon) = client_and_daemon();
    let serving = std::thread::spawn(move || {
        let mut reader = BufReader::new(daemon.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        let mut daemon = daemon;
        let refused = Event::refused(7, 4300, ErrorCode::PermissionDenied, b"{\"id\":1}");
        for line in [
            ServerLine::event(refused),
            ServerLine::ok(1, Reply::Released { tree: 3 }),
        ] {
            let mut bytes = serde_json::to_vec(&line).unwrap();
            bytes.push(b'\n');
            daemon.write_all(&bytes).unwrap();
        }
        request
    });
    client.release(3).unwrap();
    assert!(serving.join().unwrap().contains("\"release\""));
    let event = client.next_event(None).unwrap().unwrap();
    assert_eq!(event.kind, EventKind::Refused);
    assert_eq!(event.pid, Some(4300));
    assert_eq!(event.code, Some(ErrorCode::PermissionDenied));
    assert_eq!(event.line.as_deref(), Some("{\"id\":1}"));
}

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

#[test]
fn lease_tokens() {
    let read = |input: &[u8]| read_lease_token(input).map_err(|e| e.to_string());
    assert_eq!(read(b"abc\n").unwrap(), "abc");
    assert_eq!(read(b"  abc \r\nignored").unwrap(), "abc");
    assert_eq!(
        read(b"abc").unwrap(),
        "abc",
        "the end of the stream ends it too"
    );
    assert!(read(b"").unwrap_err().contains("empty"));
    assert!(read(b" \n").unwrap_err().contains("empty"));
    assert!(read(b"\xff\n").unwrap_err().contains("UTF-8"));
    let longest = vec![b'x'; MAX_TOKEN_BYTES];
    assert_eq!(read(&longest).unwrap().len(), MAX_TOKEN_BYTES);
    let mut newline_after = longest.clone();
    newline_after.push(b'\n');
    assert_eq!(read(&newline_after).unwrap().len(), MAX_TOKEN_BYTES);
    assert!(
        read(&[b'x'; MAX_TOKEN_BYTES + 1])
            .unwrap_err()
            .contains("too long")
    );
    // A writer that keeps its end open: the newline ends the token, no end of file needed.
    struct Trickle(&'static [u8]);
    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let (first, rest) = self.0.split_first().expect("read past the newline");
            buf[0] = *first;
            self.0 = rest;
            Ok(1)
        }
    }
    assert_eq!(read_lease_token(Trickle(b"abc\n")).unwrap(), "abc");
}
