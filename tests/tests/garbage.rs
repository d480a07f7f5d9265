//! Garbage, an 8 MiB line, deep nesting and unknown requests get error replies; the daemon
//! serves on, and the other leases are still enforced.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    time::Duration,
};

use leash_client::TreeOptions;
use leash_tests::{Cgroup, daemon::Daemon};
use serde_json::Value;

fn reply(reader: &mut impl BufRead) -> Value {
    let mut line = String::new();
    reader.read_line(&mut line).expect("a reply line");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
}

#[test]
fn bad_input_gets_errors_and_changes_nothing() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // Another host's tree, which must stay enforced throughout.
    let mut other = daemon.client();
    let cgroup = Cgroup::new("garbage-bystander");
    let (tree, mut bystander) = other
        .spawn(
            &mut cgroup.command("sleep", &["600"]),
            &TreeOptions::default(),
        )
        .unwrap();

    let stream = UnixStream::connect(&daemon.socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let huge = format!(
        "{{\"id\":9,\"op\":\"list\",\"pad\":\"{}\"}}",
        "x".repeat(8 << 20)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", b"this is not json".to_vec(), "bad_request"),
        ("binary", vec![0, 159, 146, 150, 255], "bad_request"),
        ("empty line", Vec::new(), "bad_request"),
        ("8 MiB line", huge.into_bytes(), "too_long"),
        ("deep nesting", nested.into_bytes(), "too_long"),
        (
            "deep nesting, short",
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            "bad_request",
        ),
        (
            "unknown op",
            br#"{"id":5,"op":"reboot"}"#.to_vec(),
            "bad_request",
        ),
        (
            "ill-typed field",
            br#"{"id":6,"op":"kill","tree":"all"}"#.to_vec(),
            "bad_request",
        ),
        (
            "missing field",
            br#"{"id":7,"op":"register"}"#.to_vec(),
            "bad_request",
        ),
        (
            "pid 1",
            br#"{"id":8,"op":"register","pid":1}"#.to_vec(),
            "bad_request",
        ),
        // Numbers out of their field's range are the client's mistake, not the daemon's:
        // before, a pid past i32::MAX reached pidfd_open and came back `internal`.
        (
            "pid 4294967295",
            br#"{"id":20,"op":"register","pid":4294967295}"#.to_vec(),
            "bad_request",
        ),
        (
            "pid past i32",
            br#"{"id":21,"op":"register","pid":2147483648}"#.to_vec(),
            "bad_request",
        ),
        (
            "pid past any pid_max",
            br#"{"id":22,"op":"register","pid":4194305}"#.to_vec(),
            "bad_request",
        ),
        (
            "pid 0",
            br#"{"id":23,"op":"register","pid":0}"#.to_vec(),
            "bad_request",
        ),
        (
            "negative pid",
            br#"{"id":24,"op":"register","pid":-5}"#.to_vec(),
            "bad_request",
        ),
        (
            "pid too big for u32",
            br#"{"id":25,"op":"register","pid":4294967296}"#.to_vec(),
            "bad_request",
        ),
        (
            "tree too big for u32",
            br#"{"id":26,"op":"kill","tree":4294967296}"#.to_vec(),
            "bad_request",
        ),
        (
            "negative grace",
            br#"{"id":27,"op":"kill","tree":1,"grace_ms":-1}"#.to_vec(),
            "bad_request",
        ),
        (
            "fractional tree",
            br#"{"id":28,"op":"release","tree":1.5}"#.to_vec(),
            "bad_request",
        ),
        (
            "huge grace",
            br#"{"id":10,"op":"kill","tree":1,"grace_ms":99999999999}"#.to_vec(),
            "bad_request",
        ),
        (
            "no such tree",
            br#"{"id":11,"op":"kill","tree":4000000}"#.to_vec(),
            "not_found",
        ),
        (
            "old protocol",
            br#"{"id":12,"op":"hello","protocol":0}"#.to_vec(),
            "unsupported_version",
        ),
    ];
    for (name, mut line, code) in cases {
        line.push(b'\n');
        writer.write_all(&line).unwrap();
        let answer = reply(&mut reader);
        eprintln!("{name}: {}", answer["error"]);
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
    }
    // The same connection still works.
    writer.write_all(b"{\"id\":13,\"op\":\"list\"}\n").unwrap();
    let answer = reply(&mut reader);
    assert_eq!(answer["id"], 13);
    assert!(answer["ok"]["trees"].is_array(), "{answer}");
    // So does a new one, and the bystander's tree is untouched.
    let trees = daemon.client().list().unwrap();
    assert!(trees.iter().any(|t| t.tree == tree && t.members.len() == 1));

    // The bystander's lease is still enforced: its host goes, its tree goes.
    drop(other);
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    assert!(
        emptied.is_some(),
        "the other lease was not enforced after the garbage"
    );
    let _ = bystander.wait();
}
