//! A viewer that stops reading during a fork storm never slows the daemon: its queue is
//! bounded, what does not fit is dropped and counted, and everyone else is served on.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use leash_client::{Event, TreeOptions};
use leash_tests::{Cgroup, daemon::Daemon};
use serde_json::Value;

const FORKS: usize = 3000;

#[test]
fn a_stalled_subscriber_costs_nothing_but_its_own_events() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // Subscribes, then never reads until the storm is over.
    let mut stalled = UnixStream::connect(&daemon.socket).unwrap();
    stalled
        .write_all(b"{\"id\":1,\"op\":\"subscribe\"}\n")
        .unwrap();
    let mut host = daemon.client();
    let cgroup = Cgroup::new("slow-viewer");
    let storm = format!("for i in $(seq {FORKS}); do /bin/true; done");
    let (_tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", &storm]),
            &TreeOptions::default(),
        )
        .unwrap();

    let mut slowest = Duration::ZERO;
    let mut probe = daemon.client();
    while root.try_wait().unwrap().is_none() {
        let asked = Instant::now();
        probe.status().unwrap();
        slowest = slowest.max(asked.elapsed());
    }
    eprintln!(
        "{FORKS} fork+exec+exit in the tree, a stalled subscriber: slowest status reply {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "the daemon was held up: {slowest:?}"
    );

    // Now read what the stalled subscriber was kept: a bounded queue and a count of the rest.
    stalled
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut kept = 0;
    let mut dropped = 0;
    for line in BufReader::new(stalled).lines() {
        let Ok(line) = line else { break };
        let value: Value = serde_json::from_str(&line).unwrap();
        if let Some(event) = value.get("event") {
            let event: Event = serde_json::from_value(event.clone()).unwrap();
            if let Some(count) = event.count {
                dropped += count;
            } else {
                kept += 1;
            }
        }
    }
    eprintln!("stalled subscriber: {kept} events kept, {dropped} dropped and counted");
    // The daemon's queue holds 1024; the socket's own buffer holds some more.
    assert!(
        kept <= 3000,
        "the queue of a stalled subscriber must be bounded: {kept}"
    );
    assert!(dropped > 0, "what did not fit is counted");
    assert!(
        kept as u64 + dropped >= (FORKS * 3) as u64,
        "every fork, exec and exit is kept or counted"
    );
}
