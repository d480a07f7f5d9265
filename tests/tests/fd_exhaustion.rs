//! Out of file descriptors. The daemon starts with a soft limit below its hard one (and raises
//! it); idle connections, more than its limit allows, then use up every descriptor it may
//! have. While it cannot accept, its log must not grow by more than a line (a failed accept
//! retried at once fails again at once: it once logged a gigabyte a minute); once the idle
//! connections close it serves new clients again; and a tree registered before is still
//! killed when its host is SIGKILLed.
//!
//! A kill needs no descriptor it cannot get: with every descriptor the daemon may have in use,
//! a host's SIGKILL still empties its tree at once (the kill draws on descriptors the daemon
//! keeps in reserve for it; without them, each round put its signals off to the next).

use std::{
    collections::BTreeSet,
    fs,
    os::unix::net::UnixStream,
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use leash_client::TreeOptions;
use leash_tests::{Cgroup, daemon::Daemon, wait_for};

/// The daemon's limits as it is started: soft below hard, low enough to run out of quickly.
const SOFT: u64 = 64;
const HARD: u64 = 128;
/// Idle connections: each costs the daemon two descriptors (the socket, the peer's pidfd), so
/// these are far more than it can hold.
const IDLE: usize = 200;
/// Connections the daemon may be setting up at once: one on each of its runtime's two threads.
const SET_UP_AT_ONCE: u64 = 2;
/// Connections made while the daemon cannot accept any: at most this many, and as many as fit
/// the daemon's limit once the idle ones are gone (see [`waiting_that_fit`]).
const WAITING: u64 = 20;
/// Fewer than this many would not be much of a storm.
const WAITING_AT_LEAST: u64 = 8;
/// How long the daemon is watched while it cannot accept.
const STORM: Duration = Duration::from_millis(1500);
/// What its log may grow by meanwhile: one line, with room to spare.
const STORM_LOG_BUDGET: u64 = 4096;

#[test]
fn running_out_of_descriptors_neither_floods_the_log_nor_stops_the_daemon() {
    // This process holds every connection.
    leash::sys::raise_fd_limit().expect("raising this test's own descriptor limit");
    let nofile = format!("--nofile={SOFT}:{HARD}");
    let Some(daemon) = Daemon::start_wrapped(&["prlimit", &nofile, "--"], &[]) else {
        return;
    };
    let pid = daemon.pid();
    assert_eq!(
        open_file_limits(pid),
        (HARD, HARD),
        "the daemon raises its soft limit to the hard one"
    );
    assert!(
        daemon.log().contains("open file limit"),
        "the daemon logs its limit:\n{}",
        daemon.log()
    );

    // A tree on a leash, before anything else.
    let cgroup = Cgroup::new("fd-exhaustion");
    let mut host = daemon
        .leash()
        .args(["run", "--grace", "100ms", "--"])
        .args(cgroup.argv("sleep", &["600"]))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    cgroup.settle_exactly(&["sleep"]);

    // What the daemon holds of its own: the programs, maps and links, the tree's pidfds.
    let own = wait_until_steady(&daemon).len() as u64;
    let idle: Vec<UnixStream> = (0..IDLE).map(|_| connect(&daemon)).collect();
    // The daemon takes what it can until it is out of descriptors; the rest wait in the queue.
    let settled = wait_until_steady(&daemon);
    // A connection keeps three (its socket, and a pidfd of its peer for itself and for the
    // enforcement thread) and needs one more while it is set up (its peer's /proc files, one at
    // a time); the daemon drops one it cannot set up. Two may be set up at once, so the last may
    // be dropped with up to eight still free.
    assert!(
        settled.len() as u64 >= HARD - SET_UP_AT_ONCE * 4,
        "the idle connections did not use up the daemon's descriptors: it has {} of {HARD}",
        settled.len()
    );
    // Make the exhaustion exact: every descriptor below the soft limit in use, so accept(2)
    // itself fails with EMFILE (with an odd number in use, the daemon would otherwise accept
    // into the last one and drop the connection it cannot watch).
    let lowest_free = (0..).find(|fd| !settled.contains(fd)).unwrap();
    set_soft_limit(pid, lowest_free);
    assert_eq!(open_fds(pid), settled, "nothing was freed meanwhile");

    let log_before = log_len(&daemon);
    let waiting_count = waiting_that_fit(own);
    let waiting: Vec<UnixStream> = (0..waiting_count).map(|_| connect(&daemon)).collect();
    std::thread::sleep(STORM);
    let grown = log_len(&daemon) - log_before;
    let log = daemon.log();
    eprintln!("log grew by {grown} bytes in {STORM:?} of failed accepts");
    assert!(
        log.contains("accept failed: Too many open files"),
        "accept never failed, so nothing was tested:\n{log}"
    );
    assert!(
        grown <= STORM_LOG_BUDGET,
        "the log grew by {grown} bytes in {STORM:?}:\n{}",
        &log[log.len().saturating_sub(2000)..]
    );

    // The idle connections close: their descriptors come back, and clients are served again.
    // (The daemon's own limit back first: the one set above may be far below its descriptors'
    // count, if the lowest free one was.)
    set_soft_limit(pid, HARD);
    drop(idle);
    // Once the daemon has closed them and taken the connections that waited meanwhile, a new
    // client finds descriptors enough (one that came in between might not).
    let after = wait_until_steady(&daemon);
    assert!(
        after.len() as u64 <= own + waiting_count * 3 && (after.len() as u64) < HARD - 4,
        "the daemon did not give back the idle connections' descriptors: it has {}, {own} of \
         its own and three for each of the {waiting_count} connections that waited",
        after.len()
    );
    let status = leash_status(&daemon);
    assert!(
        status.is_some_and(|s| s.success()),
        "a new client was not served after the idle connections closed ({status:?}):\n{}",
        daemon.log()
    );

    host.kill().unwrap();
    let emptied = cgroup.wait_empty(Duration::from_secs(10));
    let _ = host.wait();
    eprintln!("host SIGKILLed after the storm: its tree was empty after {emptied:?}");
    assert!(
        emptied.is_some(),
        "the tree outlived its host:\n{}",
        daemon.log()
    );
    drop(waiting);
}

#[test]
fn a_kill_with_every_descriptor_in_use_signals_all_the_same() {
    let nofile = format!("--nofile={SOFT}:{HARD}");
    let Some(daemon) = Daemon::start_wrapped(&["prlimit", &nofile, "--"], &[]) else {
        return;
    };
    let pid = daemon.pid();
    // The host is this test, and stays connected: its root's exit frees none of the daemon's
    // descriptors before the kill.
    let mut host = daemon.client();
    let cgroup = Cgroup::new("fd-exhaustion-kill");
    let (_tree, mut root) = host
        .spawn(
            &mut cgroup.command("sh", &["-c", "sleep 600 & exec sleep 600"]),
            &TreeOptions::default(),
        )
        .expect("spawning the tree");
    cgroup.settle_exactly(&["sleep", "sleep"]);
    // Every descriptor below the soft limit in use: nothing new can be opened.
    let settled = wait_until_steady(&daemon);
    let lowest_free = (0..).find(|fd| !settled.contains(fd)).unwrap();
    set_soft_limit(pid, lowest_free);

    root.kill().unwrap();
    let emptied = cgroup.wait_empty(Duration::from_secs(5));
    let _ = root.wait();
    eprintln!("root SIGKILLed with the daemon's table full: its tree was empty after {emptied:?}");
    set_soft_limit(pid, HARD);
    assert!(
        emptied.is_some(),
        "the tree outlived its root while the daemon had no descriptor free:\n{}",
        daemon.log()
    );
    let status = leash_status(&daemon);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

fn connect(daemon: &Daemon) -> UnixStream {
    UnixStream::connect(&daemon.socket).expect("connecting to the daemon")
}

/// `(soft, hard)` limits on open files of process `pid`, from /proc/PID/limits.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a Max open files line");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

/// The descriptors process `pid` has open.
fn open_fds(pid: u32) -> BTreeSet<u64> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The daemon's descriptors once it has taken every connection it could: neither they nor its
/// log have changed for a while. (A connection it accepts and then drops, for want of a
/// descriptor for something else, leaves the same descriptors behind, and a line in the log.)
fn wait_until_steady(daemon: &Daemon) -> BTreeSet<u64> {
    let look = || (open_fds(daemon.pid()), log_len(daemon));
    let mut last = look();
    let mut unchanged = 0;
    let steady = wait_for(Duration::from_secs(30), || {
        let now = look();
        unchanged = if now == last { unchanged + 1 } else { 0 };
        last = now;
        // wait_for polls every 10 ms: unchanged for about 300 ms.
        unchanged >= 30
    });
    assert!(steady, "the daemon's descriptors never settled");
    last.0
}

fn set_soft_limit(pid: u32, soft: u64) {
    let status = Command::new("prlimit")
        .args([
            "--pid",
            &pid.to_string(),
            &format!("--nofile={soft}:{HARD}"),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "prlimit --pid failed");
}

fn log_len(daemon: &Daemon) -> u64 {
    fs::metadata(daemon.dir.join("daemon.log")).map_or(0, |m| m.len())
}

/// `leash status`, given 30 s (a daemon that never serves it must fail the test, not hang it).
fn leash_status(daemon: &Daemon) -> Option<std::process::ExitStatus> {
    let mut child = daemon
        .leash()
        .arg("status")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (done, exited) = mpsc::channel();
    let pid = child.id();
    let waiter = std::thread::spawn(move || {
        let _ = done.send(child.wait());
    });
    let status = exited.recv_timeout(Duration::from_secs(30)).ok();
    if status.is_none() {
        leash_tests::daemon::signal(pid, "KILL");
    }
    let _ = waiter.join();
    status.and_then(Result::ok)
}

/// How many connections may wait while the daemon cannot accept: [`WAITING`], or fewer if the
/// daemon's `own` descriptors (its programs, maps, links and the tree's) leave no room for
/// three each, and four more for a new client, under [`HARD`] once the idle ones are gone.
fn waiting_that_fit(own: u64) -> u64 {
    let fit = (HARD - 5).saturating_sub(own) / 3;
    assert!(
        fit >= WAITING_AT_LEAST,
        "the daemon holds {own} descriptors of its own, which leaves room under {HARD} for only \
         {fit} waiting connections: raise HARD"
    );
    fit.min(WAITING)
}
