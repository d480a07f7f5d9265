//! The daemon's INFO log says what happened to trees, not who connected: a connection that only
//! asks (`status`, `list`, `watch`) is logged at DEBUG, and a lease first shows at INFO when it
//! registers a tree. Before, every connection logged two INFO lines ("lease opened", "lease
//! ended"): about 20 MB a minute under a client that connects in a loop.

use leash_client::TreeOptions;
use leash_tests::daemon::{Daemon, LeashedTree};

/// Connections made by the loop below.
const CONNECTIONS: usize = 200;
/// `leash status` runs after them.
const STATUS_CALLS: usize = 5;

#[test]
fn connections_that_only_ask_leave_the_info_log_quiet() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let before = daemon.log().lines().count();
    for round in 0..CONNECTIONS {
        let mut client = daemon.client();
        match round % 3 {
            0 => drop(client.status().expect("status")),
            1 => drop(client.list().expect("list")),
            _ => client.subscribe().expect("subscribe"),
        }
    }
    // A status on a new connection answers only after the daemon has seen every earlier one
    // close: one task serves each, and their ends are logged as they close.
    daemon.client().status().expect("status");
    let log = daemon.log();
    let added: Vec<&str> = log.lines().skip(before).collect();
    assert!(
        added.len() < 5,
        "{CONNECTIONS} connections that only asked logged {} lines at INFO:\n{}",
        added.len(),
        added
            .iter()
            .take(10)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );

    // `leash status`, as an operator or a probe runs it: not one line.
    let before = daemon.log().lines().count();
    for _ in 0..STATUS_CALLS {
        let status = daemon.leash().arg("status").output().unwrap();
        assert!(status.status.success(), "{status:?}");
    }
    daemon.client().status().expect("status");
    let log = daemon.log();
    let added: Vec<&str> = log
        .lines()
        .skip(before)
        .filter(|line| line.contains(" INFO ") || line.contains(" WARN "))
        .collect();
    assert!(
        added.is_empty(),
        "{STATUS_CALLS} `leash status` logged at INFO:\n{}",
        added.join("\n")
    );

    // A lease that registers a tree is worth a line, and so is its end.
    let mut host = daemon.client();
    let lease = host.lease().id;
    let tree = LeashedTree::spawn(
        &mut host,
        "log-volume",
        "sleep",
        &["600"],
        &TreeOptions::default(),
    );
    // In its cgroup first: the process moves itself there once registered.
    tree.cgroup.settle_exactly(&["sleep"]);
    drop(host);
    assert!(
        tree.cgroup
            .wait_empty(std::time::Duration::from_secs(30))
            .is_some(),
        "the lease's end killed its tree"
    );
    let log = plain(&daemon.log());
    let about_lease = |what: &str| {
        log.lines()
            .any(|line| line.contains(what) && line.contains(&format!("lease={lease} ")))
    };
    assert!(about_lease("event=\"lease_opened\""), "{log}");
    assert!(about_lease("event=\"lease_ended\""), "{log}");
}

/// The log without its colours (ANSI escapes), as a reader sees it.
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // An escape runs to its final letter (`m` for a colour).
            chars.by_ref().find(char::is_ascii_alphabetic);
        } else {
            out.push(c);
        }
    }
    out
}
