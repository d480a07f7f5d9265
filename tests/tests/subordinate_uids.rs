//! A user is a user, whatever uids they hold. Alice (uid 61001) has a user namespace whose uid
//! map is written as `newuidmap` writes a rootless container's: her own uid as root inside,
//! then nine subordinate uids of hers (300000 and up). Her nine `leash run`s, one per
//! subordinate uid, are charged to her alone: her tree, member and connection limits hold across
//! them, and
//! Bob's tree, started before, is untouched. (Charged per kernel uid, she would be nine users:
//! every one of her trees would be registered, and each would have a quota of its own.)

use std::{
    collections::BTreeSet,
    io::Write,
    process::{Child, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use leash_client::{EventKind, EventReason, protocol::KillReason};
use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, setpriv_args},
    read_lines,
};

const SUBORDINATE: u32 = 300_000;

/// In Alice's new user namespace, once its map is written (a line on stdin): nine `leash run`s
/// of `$2`, each as one of the subordinate uids; prints each one's exit status.
const ALICE: &str = r#"read mapped
for k in 1 2 3 4 5 6 7 8 9; do
  (setpriv --reuid $k --regid $k --clear-groups "$0" --socket "$1" run -- sh -c "$2" 2>/dev/null
   echo "exit $?") &
done
wait"#;

#[test]
fn subordinate_uids_share_their_users_tree_limit() {
    let Some(daemon) = Daemon::start(&["--max-trees-per-uid", "3"]) else {
        return;
    };
    let mut alice = Alice::start(&daemon, "exec sleep 600");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    while refused < 6 && Instant::now() < deadline {
        refused += alice.refusals(Duration::from_millis(100));
    }
    let listed = daemon.client().list().unwrap().len();
    eprintln!("of nine leash runs, {refused} refused; trees: {listed}");
    assert_eq!(refused, 6, "daemon log:\n{}", daemon.log());
    assert_eq!(listed, 3 + 1, "her three trees and Bob's");
    alice.bob_is_untouched();
}

#[test]
fn subordinate_uids_share_their_users_connection_limit() {
    let Some(daemon) = Daemon::start(&["--max-connections-per-uid", "3"]) else {
        return;
    };
    // Each `leash run` holds one connection for as long as its command runs.
    let mut alice = Alice::start(&daemon, "exec sleep 600");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    while refused < 6 && Instant::now() < deadline {
        refused += alice.refusals(Duration::from_millis(100));
    }
    eprintln!("of nine leash runs at 3 connections a user, {refused} refused");
    assert_eq!(refused, 6, "daemon log:\n{}", daemon.log());
    alice.bob_is_untouched();
}

#[test]
fn subordinate_uids_share_their_users_member_quota() {
    let Some(daemon) = Daemon::start(&["--max-members-per-uid", "12"]) else {
        return;
    };
    let mut watcher = daemon.client();
    watcher.subscribe().unwrap();
    // Nine trees of seven: 63 members, where one user may have 12.
    let alice = Alice::start(&daemon, "for i in 1 2 3 4 5 6; do sleep 600 & done; wait");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut over_quota = false;
    while !over_quota && Instant::now() < deadline {
        if let Some(event) = watcher
            .next_event(Some(Duration::from_millis(500)))
            .unwrap()
        {
            over_quota = event.kind == EventKind::KillStarted
                && event.reason == Some(EventReason::Kill(KillReason::MemberQuota));
        }
    }
    assert!(
        over_quota,
        "her trees share one quota of 12; daemon log:\n{}",
        daemon.log()
    );
    alice.bob_is_untouched();
}

/// Bob's tree, then Alice's namespace and its nine `leash run`s.
struct Alice {
    bob: Cgroup,
    bobs: BTreeSet<u32>,
    bob_host: Child,
    _cgroup: Cgroup,
    namespace: Child,
    statuses: mpsc::Receiver<String>,
}

impl Alice {
    fn start(daemon: &Daemon, command: &str) -> Self {
        let bob = Cgroup::new("subuid-bob");
        let bob_host = daemon
            .leash_as(
                USER_B,
                &bob,
                &["run", "--", "sh", "-c", "sleep 600 & sleep 600 & wait"],
            )
            .spawn()
            .unwrap();
        let bobs = bob.settle_exactly(&["leash", "sh", "sleep", "sleep"]);

        let cgroup = Cgroup::new("subuid-alice");
        let leash = daemon.leash_for_anyone();
        let mut argv = setpriv_args(USER_A);
        argv.extend(["unshare", "--user", "--", "sh", "-c", ALICE].map(String::from));
        argv.extend([path_str(&leash), path_str(&daemon.socket), command].map(String::from));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut namespace = cgroup
            .command("setpriv", &argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // As newuidmap would: her own uid as root, then her subordinate range.
        let map = format!("0 {USER_A} 1\n1 {SUBORDINATE} 9\n");
        let pid = namespace.id();
        let written = wait_for_write(&format!("/proc/{pid}/uid_map"), &map)
            && wait_for_write(&format!("/proc/{pid}/gid_map"), &map);
        assert!(written, "could not write the namespace's maps");
        writeln!(namespace.stdin.as_mut().unwrap(), "mapped").unwrap();
        let statuses = read_lines(&mut namespace);
        Self {
            bob,
            bobs,
            bob_host,
            _cgroup: cgroup,
            namespace,
            statuses,
        }
    }

    /// How many of her `leash run`s were refused (exit 125) in the next `wait`.
    fn refusals(&mut self, wait: Duration) -> usize {
        let mut refused = 0;
        while let Ok(line) = self.statuses.recv_timeout(wait) {
            refused += usize::from(line == "exit 125");
        }
        refused
    }

    fn bob_is_untouched(&self) {
        assert_eq!(self.bob.procs(), self.bobs, "Bob's tree is untouched");
    }
}

impl Drop for Alice {
    fn drop(&mut self) {
        for child in [&mut self.namespace, &mut self.bob_host] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Writes `contents` to `path` once the file is there (the namespace is made as its process
/// starts).
fn wait_for_write(path: &str, contents: &str) -> bool {
    leash_tests::wait_for(Duration::from_secs(20), || {
        std::fs::write(path, contents).is_ok()
    })
}
