//! `leash watch` in a real terminal (tmux): the tree's pids show up on the screen under column
//! headers, with a busy member's CPU % and a big one's resident memory as /proc has them, and
//! a lease whose trees are gone; `leash ls --json` carries the same figures; `K` then `y` kills
//! the tree, its members' exits are shown as the kill's, its pids go from the screen, `q` quits.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use leash_client::{TreeInfo, TreeOptions};
use leash_tests::{
    Cgroup,
    daemon::{Daemon, path_str},
    leash_binary, python,
    tmux::Tmux,
    wait_for,
};

/// A member that keeps a CPU busy, and one that holds 64 MiB, every page touched.
const BUSY: &str = "while :; do :; done";
const BIG: &str = "import time; b = b'x' * (64 << 20); time.sleep(600)";
const MIB: u64 = 1 << 20;

#[test]
fn watch_shows_the_tree_and_kills_it_with_k() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    // A lease whose one tree is gone: its host (this test) lives on, and watch shows it.
    let mut idle_host = daemon.client();
    let idle_group = Cgroup::new("watch-idle");
    let (gone, mut root) = idle_host
        .spawn(
            &mut idle_group.command("true", &[]),
            &TreeOptions::default(),
        )
        .unwrap();
    root.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || idle_host
            .list()
            .is_ok_and(|trees| trees.iter().all(|t| t.tree != gone))),
        "the tree of a root that exited is still listed"
    );

    let cgroup = Cgroup::new("watch-tmux");
    let script = format!(
        "setsid sleep 600 & sh -c '{BUSY}' & {} -c \"{BIG}\" & exec sleep 600",
        python()
    );
    let mut host = daemon
        .leash()
        .args(["run", "--"])
        .args(cgroup.argv("sh", &["-c", &script]))
        // It says that K killed its tree.
        .stderr(daemon.clients_log())
        .spawn()
        .unwrap();
    let pids = cgroup.settle_exactly(&["sleep", "sleep", "sh", "python"]);
    let by_comm = |name: &str| {
        *pids
            .iter()
            .find(|&&pid| leash_tests::comm(pid).is_some_and(|c| c.starts_with(name)))
            .unwrap()
    };
    let (busy, big) = (by_comm("sh"), by_comm("python"));
    assert!(
        wait_for(Duration::from_secs(20), || stat_rss(big) >= 64 * MIB),
        "python did not take its 64 MiB"
    );

    ls_json_agrees_with_proc(&daemon, busy, big, &pids);

    let tmux = Tmux::new("watch");
    let watch = format!(
        "{} --socket {} watch",
        path_str(&leash_binary()),
        path_str(&daemon.socket)
    );
    tmux.start("watch", (100, 30), &watch);

    let on_screen = |screen: &str| pids.iter().all(|pid| screen.contains(&pid.to_string()));
    assert!(
        wait_for(Duration::from_secs(20), || on_screen(
            &tmux.screen_of("watch")
        )),
        "pids not shown:\n{}",
        tmux.screen_of("watch")
    );
    eprintln!("leash watch, live:\n{}", tmux.screen_of("watch"));
    watch_shows_the_figures(&tmux, busy, big);
    let idle_lease = format!(
        "lease {}  host {} ",
        idle_host.lease().id,
        std::process::id()
    );
    assert!(
        tmux.screen_of("watch")
            .lines()
            .any(|l| l.starts_with(&idle_lease) && l.ends_with("no trees now")),
        "the lease without trees is not shown:\n{}",
        tmux.screen_of("watch")
    );

    ls_in_a_terminal(&tmux, &daemon, busy);

    // The first line is the idle lease; the next the tree's lease, then the tree.
    tmux.keys_to("watch", "j");
    tmux.keys_to("watch", "j");
    tmux.keys_to("watch", "K");
    assert!(
        wait_for(Duration::from_secs(10), || tmux
            .screen_of("watch")
            .contains("? y/n")),
        "no confirmation:\n{}",
        tmux.screen_of("watch")
    );
    tmux.keys_to("watch", "y");
    let emptied = cgroup.wait_empty(Duration::from_secs(20));
    assert!(emptied.is_some(), "K did not kill the tree");
    assert!(
        wait_for(Duration::from_secs(10), || {
            let screen = tmux.screen_of("watch");
            screen.contains("trees 0")
                && pids
                    .iter()
                    .all(|pid| !screen.contains(&format!("  {pid} ")))
        }),
        "the killed tree is still shown:\n{}",
        tmux.screen_of("watch")
    );
    // The processes' exits while their tree is killed are shown as the kill's, not as
    // ordinary activity that reads like an escape.
    assert!(
        wait_for(Duration::from_secs(10), || tmux
            .screen_of("watch")
            .contains("(sleep) exited during the kill")),
        "the exits of the kill are not shown as the kill's:\n{}",
        tmux.screen_of("watch")
    );
    eprintln!("after K, y:\n{}", tmux.screen_of("watch"));

    tmux.keys_to("watch", "q");
    assert!(
        wait_for(Duration::from_secs(10), || !tmux.alive("watch")),
        "q did not quit"
    );
    let _ = host.wait();
    drop(idle_host);
}

/// The screen's columns for `pid`: PID USER S CPU% RSS AGE COMMAND..., if it is shown.
fn columns(screen: &str, pid: u32) -> Option<Vec<String>> {
    screen
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .find(|words| words.len() >= 7 && words[0] == pid.to_string())
}

/// Waits for the headers, then for a sample that shows `busy` using a CPU (as much as /proc
/// says it gets on this machine, 2 cores shared) and `big` holding its 64 MiB.
fn watch_shows_the_figures(tmux: &Tmux, busy: u32, big: u32) {
    let header = ["PID", "USER", "S", "CPU%", "RSS", "AGE", "COMMAND"];
    let screen = tmux.screen_of("watch");
    assert!(
        screen
            .lines()
            .any(|l| l.split_whitespace().eq(header.iter().copied())),
        "no column headers:\n{screen}"
    );
    // The loop gets what this machine (2 cores, shared) gives it: the view must show what
    // /proc says it got, and above 50% whenever /proc says it got most of a CPU.
    let started = Instant::now();
    let cpu_before = stat_cpu_ms(busy);
    let (mut shown_cpu, mut truth) = (f64::NAN, f64::NAN);
    let mut last = String::new();
    let sampled = wait_for(Duration::from_secs(15), || {
        last = tmux.screen_of("watch");
        // "-" until the view has listed twice.
        let Some(cpu) = columns(&last, busy).and_then(|words| words[3].parse::<f64>().ok()) else {
            return false;
        };
        let elapsed = started.elapsed();
        if elapsed < Duration::from_secs(1) {
            return false;
        }
        shown_cpu = cpu;
        truth = (stat_cpu_ms(busy) - cpu_before) as f64 * 100.0 / elapsed.as_millis() as f64;
        (shown_cpu - truth).abs() < 30.0 && (shown_cpu > 50.0 || truth < 60.0)
    });
    assert!(
        sampled,
        "CPU {shown_cpu}% shown for the busy member, /proc says {truth:.0}% over the same time:\n{last}"
    );
    eprintln!("leash watch, sampled (/proc says the loop got {truth:.0}%):\n{last}");
    let words = columns(&last, busy).expect("the busy member is shown");
    assert_eq!(words[6..].join(" "), format!("sh -c {BUSY}"), "{last}");
    let words = columns(&tmux.screen_of("watch"), big).expect("the big member is shown");
    let shown_mib: u64 = words[4].trim_end_matches('M').parse().expect("RSS in MiB");
    let truth = stat_rss(big);
    // A MiB for the rounding, and the counters' drift between the view's read and this one.
    assert!(
        shown_mib >= 60 && (shown_mib * MIB).abs_diff(truth) <= MIB + rss_drift(),
        "RSS {} shown, /proc says {} MiB (± {} KiB of drift allowed):\n{last}",
        words[4],
        truth / MIB,
        rss_drift() >> 10
    );
    assert!(
        words[6].ends_with("python3") || words[6].contains("python"),
        "{last}"
    );
}

/// `leash ls` in a terminal 100 columns wide: the headers, the busy member's CPU % (it lists
/// twice), every line cut at the edge.
fn ls_in_a_terminal(tmux: &Tmux, daemon: &Daemon, busy: u32) {
    let ls = format!(
        "{} --socket {} ls; sleep 60",
        path_str(&leash_binary()),
        path_str(&daemon.socket)
    );
    tmux.start("ls", (100, 12), &ls);
    let mut screen = String::new();
    assert!(
        wait_for(Duration::from_secs(10), || {
            screen = tmux.screen_of("ls");
            screen.contains("no trees now")
        }),
        "leash ls did not finish:\n{screen}"
    );
    eprintln!("leash ls, in tmux:\n{screen}");
    assert!(
        screen
            .lines()
            .any(|l| l.trim_start().starts_with("PID USER     S  CPU%"))
    );
    let words = columns(&screen, busy).expect("the busy member is listed");
    assert!(words[3].parse::<f64>().is_ok(), "no CPU % in:\n{screen}");
    assert!(screen.lines().all(|l| l.chars().count() <= 100));
    tmux.run(&["kill-session", "-t", "ls"]);
}

/// `leash ls --json` lists every member with its user, command line, CPU time and RSS as
/// /proc has them, and the tree's sums.
fn ls_json_agrees_with_proc(daemon: &Daemon, busy: u32, big: u32, pids: &BTreeSet<u32>) {
    let (cpu_before, rss_before) = (stat_cpu_ms(busy), stat_rss(big));
    let ls = daemon.leash().args(["ls", "--json"]).output().unwrap();
    let (cpu_after, rss_after) = (stat_cpu_ms(busy), stat_rss(big));
    let trees: Vec<TreeInfo> =
        serde_json::from_slice(&ls.stdout).expect("ls --json is a tree array");
    let tree = trees
        .iter()
        .find(|t| t.members.iter().any(|m| m.pid == busy))
        .expect("the tree is listed");
    let listed: BTreeSet<u32> = tree.members.iter().map(|m| m.pid).collect();
    assert_eq!(&listed, pids);
    for member in &tree.members {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", member.pid)).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let expected: String = cmdline.trim_end().chars().take(200).collect();
        let got = member.cmdline.as_deref().unwrap_or_default();
        assert!(got.starts_with(&expected), "{got:?} is not {expected:?}");
        assert_eq!(member.uid, Some(status_euid(member.pid)), "{member:?}");
    }
    let member = |pid| tree.members.iter().find(|m| m.pid == pid).unwrap();
    let cpu = member(busy).cpu_ms.expect("cpu_ms");
    assert!(
        (cpu_before..=cpu_after).contains(&cpu),
        "cpu_ms {cpu}, /proc said {cpu_before} before and {cpu_after} after"
    );
    let rss = member(big).rss_bytes.expect("rss_bytes");
    let drift = rss_drift();
    let around =
        rss_before.min(rss_after).saturating_sub(drift)..=rss_before.max(rss_after) + drift;
    assert!(
        rss >= 60 * MIB && around.contains(&rss),
        "rss_bytes {rss}, /proc said {rss_before} before and {rss_after} after (± {drift} \
         allowed)"
    );
    let sum = |f: fn(&leash_client::MemberInfo) -> Option<u64>| {
        tree.members.iter().filter_map(f).sum::<u64>()
    };
    assert_eq!(tree.cpu_ms, Some(sum(|m| m.cpu_ms)));
    assert_eq!(tree.rss_bytes, Some(sum(|m| m.rss_bytes)));

    let text = daemon.leash().arg("ls").output().unwrap();
    eprintln!("leash ls:\n{}", String::from_utf8_lossy(&text.stdout));
}

/// utime + stime of /proc/PID/stat, in milliseconds.
fn stat_cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which may hold spaces): state is the first.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks * 1000 / leash::proc::ticks_per_second()
}

/// How far two reads of a process's RSS from /proc/PID/stat may differ while it holds the same
/// pages. Since Linux 6.2 the counters behind it (file, anon and shmem pages) are per-CPU
/// (percpu_counter), and stat reads their approximate total: a CPU folds its part into the
/// total only once that part reaches `batch` pages either way, so each counter's total is off
/// by less than batch pages per CPU, and moves whenever a CPU folds (the process's pages freed
/// or faulted in on some CPU, by itself or the kernel). Two reads: twice that. The batch is
/// max(32, 2 × online CPUs) (percpu_counter_batch), with a part per possible CPU. With no such
/// slack the comparisons failed now and then, by a few dozen pages.
fn rss_drift() -> u64 {
    let online = cpus("online").len() as u64;
    let possible = cpus("possible").last().map_or(online, |last| last + 1);
    let batch = 32.max(2 * online);
    2 * 3 * possible.max(1) * batch * procfs::page_size()
}

/// The CPUs /sys/devices/system/cpu/`list` names ("0-3,5"), in order.
fn cpus(list: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(format!("/sys/devices/system/cpu/{list}"))
        .unwrap_or_else(|e| panic!("reading the {list} CPUs: {e}"));
    text.trim()
        .split(',')
        .filter_map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            Some(first.parse::<u64>().ok()?..=last.parse::<u64>().ok()?)
        })
        .flatten()
        .collect()
}

/// Resident memory from /proc/PID/stat, in bytes: where the daemon reads it. (statm sums the
/// kernel's per-CPU counters, where stat reads their approximate total: the two differed by
/// 23 pages on a 64 MiB process that did not change between reads.)
fn stat_rss(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name's closing parenthesis: field 3 (the state) first, rss (24) 22nd.
    let pages: u64 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(21))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * procfs::page_size()
}

/// The effective uid in /proc/PID/status.
fn status_euid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
    uids.split_whitespace().nth(1).unwrap().parse().unwrap()
}
