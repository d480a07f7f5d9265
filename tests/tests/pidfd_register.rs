//! Registering by a pidfd sent with the request (SCM_RIGHTS). It names the process itself, and
//! goes with its own line only; a request that says `"pidfd": true` with none sent, or with
//! both a pid and a pidfd, is refused; a descriptor that is not a pidfd ends the connection,
//! and the daemon serves on.

use std::{
    io::{BufRead, BufReader, Write},
    os::{
        fd::{AsFd, OwnedFd},
        unix::net::UnixStream,
    },
    time::Duration,
};

use leash_client::{TreeOptions, protocol::PROTOCOL_VERSION, sys};
use leash_tests::{Cgroup, daemon::Daemon, wait_for};
use serde_json::{Value, json};

struct Connection {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Connection {
    fn open(daemon: &Daemon) -> Self {
        let stream = UnixStream::connect(&daemon.socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut connection = Self {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        };
        let hello = connection.ask(
            json!({"id": 1, "op": "hello", "protocol": PROTOCOL_VERSION}),
            None,
        );
        assert!(hello["ok"].is_object(), "{hello}");
        connection
    }

    /// Sends `request`, with `fd` attached if given; returns the reply, or Null at end of file.
    fn ask(&mut self, request: Value, fd: Option<&OwnedFd>) -> Value {
        let line = format!("{request}\n");
        match fd {
            Some(fd) => sys::send_with_fd(&self.writer, line.as_bytes(), fd.as_fd()).unwrap(),
            None => self.writer.write_all(line.as_bytes()).unwrap(),
        }
        let mut reply = String::new();
        self.reader.read_line(&mut reply).unwrap();
        if reply.is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("not JSON ({e}): {reply:?}"))
    }
}

#[test]
fn a_pidfd_names_the_process_to_register() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("pidfd-register");
    let mut sleeper = cgroup.command("sleep", &["600"]).spawn().unwrap();
    let pidfd = sys::pidfd_open(sleeper.id()).unwrap();
    let mut connection = Connection::open(&daemon);

    let both = connection.ask(
        json!({"id": 2, "op": "register", "pid": sleeper.id(), "pidfd": true}),
        Some(&pidfd),
    );
    assert_eq!(both["error"]["code"], "bad_request", "{both}");
    // A pidfd goes with its own line: the one the refused request came with is not the next's.
    let none_sent = connection.ask(json!({"id": 3, "op": "register", "pidfd": true}), None);
    assert_eq!(none_sent["error"]["code"], "bad_request", "{none_sent}");
    assert!(
        none_sent["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no pidfd came with the request")),
        "{none_sent}"
    );
    let registered = connection.ask(
        json!({"id": 4, "op": "register", "pidfd": true}),
        Some(&pidfd),
    );
    assert_eq!(
        registered["ok"]["registered"]["root"],
        sleeper.id(),
        "{registered}"
    );

    // The tree dies with the connection's lease.
    drop(connection);
    assert!(
        wait_for(Duration::from_secs(30), || {
            sleeper.try_wait().unwrap().is_some()
        }),
        "the process registered by its pidfd outlived the lease"
    );
}

#[test]
fn a_descriptor_that_is_not_a_pidfd_ends_the_connection() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // Another host's tree, which must stay enforced throughout.
    let mut other = daemon.client();
    let cgroup = Cgroup::new("pidfd-bystander");
    let (tree, mut bystander) = other
        .spawn(
            &mut cgroup.command("sleep", &["600"]),
            &TreeOptions::default(),
        )
        .unwrap();

    let mut connection = Connection::open(&daemon);
    let (pipe, _writer) = std::io::pipe().unwrap();
    let reply = connection.ask(
        json!({"id": 2, "op": "register", "pidfd": true}),
        Some(&pipe.into()),
    );
    assert_eq!(reply, Value::Null, "the connection is closed, unanswered");

    // The daemon serves on, and the other tree is still enforced.
    let summary = other.kill(tree, None).unwrap();
    assert_eq!((summary.tree, summary.terminated), (tree, 1));
    let status = bystander.wait().unwrap();
    assert!(
        !status.success(),
        "the other host's command was killed: {status}"
    );
}
