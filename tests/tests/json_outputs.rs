//! The JSON outputs (docs/JSON.md) parse as documented, carry what happened, and show a
//! non-root user its own trees only.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    sync::mpsc,
    thread,
    time::Duration,
};

use leash_client::{Event, EventKind, StatusInfo, TreeInfo, TreeOptions};
use leash_tests::{
    Cgroup,
    daemon::{self, Daemon, LeashedTree, path_str},
    wait_for,
};

#[test]
fn ls_status_and_watch_speak_the_documented_json() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut watch = daemon
        .leash()
        .args(["watch", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });

    // Until the watcher has subscribed, its lines are missing: a probe tree, registered and
    // released until the watcher reports it, tells when it has.
    let mut host = daemon.client();
    let probe_group = Cgroup::new("json-probe");
    let mut probe = probe_group.command("sleep", &["600"]).spawn().unwrap();
    loop {
        let tree = host.adopt(probe.id(), &TreeOptions::default()).unwrap();
        host.release(tree).unwrap();
        if lines.recv_timeout(Duration::from_millis(200)).is_ok() {
            break;
        }
    }
    while lines.try_recv().is_ok() {}
    let _ = probe.kill();
    let _ = probe.wait();

    let cgroup = Cgroup::new("json");
    let (tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "sleep 600 & wait"]),
            &TreeOptions::default(),
        )
        .unwrap();
    let pids = cgroup.settle_exactly(&["sh", "sleep"]);

    let ls = daemon.leash().args(["ls", "--json"]).output().unwrap();
    let trees: Vec<TreeInfo> =
        serde_json::from_slice(&ls.stdout).expect("ls --json is a tree array");
    assert_eq!(trees.len(), 1);
    assert_eq!(trees[0].tree, tree);
    let listed: std::collections::BTreeSet<u32> = trees[0].members.iter().map(|m| m.pid).collect();
    assert_eq!(listed, pids);

    let status = daemon.leash().args(["status", "--json"]).output().unwrap();
    let status: StatusInfo = serde_json::from_slice(&status.stdout).expect("status --json");
    assert_eq!((status.trees, status.members), (1, 2));
    // The three that track, and the ptrace guard's, whichever is in place.
    for tracker in ["leash_fork", "leash_exit", "leash_exec"] {
        assert!(
            status.programs.iter().any(|p| p.starts_with(tracker)),
            "{tracker} in {:?}",
            status.programs
        );
    }
    let pinned_at = status.pinned_at.expect("the daemon pins by default");
    assert!(
        pinned_at.starts_with(leash_tests::daemon::path_str(&daemon.pins)),
        "{pinned_at}"
    );

    host.kill(tree, Some(Duration::ZERO)).unwrap();
    let _ = root.wait();
    let mut kinds = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        let event: Event = serde_json::from_str(&line).expect("a documented event line");
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_received_now(value["time"].as_str().expect("a time on every line"));
        if event.tree != tree {
            continue;
        }
        kinds.push(event.kind);
        if event.kind == EventKind::TreeEmpty {
            break;
        }
    }
    eprintln!("watch --json saw {kinds:?}");
    for kind in [
        EventKind::Registered,
        EventKind::Exec,
        EventKind::Fork,
        EventKind::KillStarted,
        EventKind::Exit,
        EventKind::TreeEmpty,
    ] {
        assert!(kinds.contains(&kind), "no {kind:?} in {kinds:?}");
    }
    let _ = watch.kill();
    let _ = watch.wait();
}

/// `time` is RFC 3339, UTC, to the millisecond (`2026-12-02T05:21:03.123Z`), and it is now:
/// when `leash watch --json` read the event.
fn assert_received_now(time: &str) {
    let shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    assert!(
        time.len() == shape.len()
            && time.chars().zip(shape.chars()).all(|(c, s)| match s {
                'd' => c.is_ascii_digit(),
                _ => c == s,
            }),
        "{time}"
    );
    let date = std::process::Command::new("date")
        .args(["-u", "-d", time, "+%s"])
        .output()
        .unwrap();
    let seconds: u64 = String::from_utf8_lossy(&date.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("date cannot read {time}: {date:?}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(seconds) < 120, "{time} is not now ({now})");
}

/// A `list` with the leases, its reply printed: argv is the socket.
const LIST_WITH_LEASES: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b'{"id":1,"op":"list","leases":true}\n')
print(s.makefile().readline().strip())
"#;

#[test]
fn a_user_sees_only_its_own_trees() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    let _roots = LeashedTree::spawn(
        &mut host,
        "json-visibility",
        "sleep",
        &["600"],
        &TreeOptions::default(),
    );
    let leash = daemon.leash_for_anyone();
    let as_nobody = |args: &[&str]| {
        daemon::as_nobody(&leash)
            .arg("--socket")
            .arg(path_str(&daemon.socket))
            .args(args)
            .output()
            .unwrap()
    };
    let trees: Vec<TreeInfo> =
        serde_json::from_slice(&as_nobody(&["ls", "--json"]).stdout).unwrap();
    assert!(trees.is_empty(), "nobody sees root's trees: {trees:?}");
    // Nor root's leases, asked for with the trees (`leases`): the host's holds a tree.
    let listing = daemon::as_nobody("/usr/bin/python3")
        .args(["-c", LIST_WITH_LEASES, path_str(&daemon.socket)])
        .current_dir("/")
        .output()
        .unwrap();
    let listing: serde_json::Value = serde_json::from_slice(&listing.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&listing.stderr)));
    assert_eq!(
        listing["ok"]["listing"],
        serde_json::json!({"trees": [], "leases": []}),
        "nobody sees none of root's leases"
    );
    let listing = daemon.client().listing().unwrap();
    assert_eq!(listing.leases.len(), 1, "root sees the host's: {listing:?}");
    let status: StatusInfo =
        serde_json::from_slice(&as_nobody(&["status", "--json"]).stdout).unwrap();
    assert_eq!(status.leases, 1, "only its own connection");
    assert_eq!(status.host_leases, 0, "which is no host's");
    assert_eq!(daemon.client().list().unwrap().len(), 1, "root sees it");
    // Root sees every connection: the host's, which holds a tree, and its own, which asks.
    // (Connections closed just before may still be ending: their leases end as the daemon
    // sees them close.)
    let _viewer = daemon.client();
    let mut status = None;
    let counted = wait_for(Duration::from_secs(10), || {
        let out = daemon.leash().args(["status", "--json"]).output().unwrap();
        let read: StatusInfo = serde_json::from_slice(&out.stdout).unwrap();
        let counts = (read.leases, read.host_leases);
        status = Some(read);
        counts == (3, 1)
    });
    assert!(counted, "host, viewer and asker: {status:?}");
    let text = daemon.leash().arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("hosts' leases: 1\nother connections: "),
        "{text}"
    );
}
