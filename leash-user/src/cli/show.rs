//! `leash ls` and `leash status`: what is on a leash now, for people and (with --json) scripts.
//! The JSON shapes are the protocol's (docs/JSON.md).

use std::{
    io::Write,
    path::Path,
    process::ExitCode,
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::Args;
use leash_client::{Client, Listing, StatusInfo};

use super::view::{self, CpuRates, HEADER, Users, member_rows};

/// How long `leash ls` watches CPU use: it lists twice, this far apart.
const CPU_SAMPLE: Duration = Duration::from_millis(200);

#[derive(Args, Debug)]
pub(super) struct ShowArgs {
    /// Print JSON (one document) instead of text.
    #[arg(long)]
    json: bool,
}

/// `leash ls`: the text lists twice, 200 ms apart, for each process's CPU % over that time;
/// `--json` lists once (with each process's CPU time so far).
pub(super) fn ls(socket: &Path, args: ShowArgs) -> Result<ExitCode> {
    let mut client = Client::connect_to(socket)?;
    let mut out = super::stdout::lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &client.list()?)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut cpu = CpuRates::default();
    let first = client.listing()?;
    cpu.sample(&first.trees, Instant::now());
    let mut listing = first;
    if !listing.trees.is_empty() {
        thread::sleep(CPU_SAMPLE);
        listing = client.listing()?;
        cpu.sample(&listing.trees, Instant::now());
    }
    let width = out
        .is_terminal()
        .then(|| ratatui::crossterm::terminal::size().ok())
        .flatten()
        .map(|(columns, _)| usize::from(columns));
    let now_ns = leash::proc::boot_time_ns().unwrap_or(0);
    for line in ls_text(&listing, now_ns, &cpu, &Users::from_passwd()).lines() {
        match width {
            Some(width) => writeln!(out, "{}", view::fit(line, width))?,
            None => writeln!(out, "{line}")?,
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn status(socket: &Path, args: ShowArgs) -> Result<ExitCode> {
    let status = Client::connect_to(socket)?.status()?;
    let mut out = super::stdout::lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &status)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", status_text(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn ls_text(listing: &Listing, now_ns: u64, cpu: &CpuRates, users: &Users) -> String {
    let tree_less = || listing.leases.iter().filter(|l| l.trees == 0);
    if listing.trees.is_empty() && tree_less().next().is_none() {
        return "no trees on a leash\n".to_owned();
    }
    let mut text = format!("{HEADER}\n");
    for tree in &listing.trees {
        let label = format!("tree {}", tree.tree);
        text += &view::tree_line(&label, tree, cpu.of_tree(tree));
        text += &format!(
            "  host {} ({})  uid {}  lease {}\n",
            tree.host_pid,
            tree.host_comm.as_deref().unwrap_or("gone"),
            tree.owner_uid,
            tree.lease,
        );
        for row in member_rows(&tree.members, now_ns, cpu) {
            text += &view::member_line(&row, users);
            text += "\n";
        }
        if tree.members_truncated {
            let more = tree.member_count.saturating_sub(tree.members.len() as u64);
            let more = super::counts::count(more, "more member", "more members");
            text += &format!("  ... and {more}, not listed\n");
        }
    }
    for lease in tree_less() {
        text += &format!(
            "lease {}  host {} ({})  uid {}  no trees now\n",
            lease.lease,
            lease.host_pid,
            lease.host_comm.as_deref().unwrap_or("gone"),
            lease.owner_uid,
        );
    }
    text
}

fn status_text(status: &StatusInfo) -> String {
    let mut text = format!(
        "leash daemon {} (protocol {})\n",
        status.daemon_version, status.protocol
    );
    text += "programs attached:\n";
    for program in &status.programs {
        text += &format!("  {program}\n");
    }
    // A viewer's or a probe's connection is a lease too (this one's among them): the hosts'
    // are those that registered a tree.
    let others = status.leases.saturating_sub(status.host_leases);
    text += &format!(
        "members: {} of {}\ntrees: {} of {}\nhosts' leases: {}\nother connections: {others} \
         (viewers, probes, this one)\nevents dropped: {}\ninserts failed: {}\n",
        status.members,
        status.member_capacity,
        status.trees,
        status.tree_capacity,
        status.host_leases,
        status.events_dropped,
        status.inserts_failed,
    );
    if let Some(membership) = &status.membership {
        text += &format!("membership: {}\n", membership_text(membership));
    }
    // From the programs listed: every daemon lists them.
    text += &format!("{}\n", super::doctor::guard_of(&status.programs).describe());
    text += &match (&status.pinned_at, status.pins_missing.len()) {
        (Some(dir), 0) => format!("pinned at {dir}: tracking goes on if the daemon dies\n"),
        (Some(dir), missing) => format!(
            "pinned at {dir}, but {missing} of its pins are gone (removed since it started): \
             tracking ends with the daemon after all; a restart pins again (a stop kills its \
             trees; `leash doctor` shows what is missing)\n"
        ),
        (None, _) => "not pinned: tracking ends with the daemon\n".to_owned(),
    };
    text
}

/// What a membership guarantee's name promises.
fn membership_text(name: &str) -> String {
    match name {
        "marks" => "exact (marks: an LSM program on task_alloc, which the kernel never skips, \
                    marks every member's child before it runs)"
            .to_owned(),
        "layered" => "layered (the fork programs alone: a kernel that runs them preemptibly, \
                      Linux 7.x, can skip them and miss a fork; `leash doctor` says what to do)"
            .to_owned(),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use leash_client::{LeaseSummary, MemberInfo, RootExitPolicy, TreeInfo};

    use super::*;

    #[test]
    fn ls_shows_each_tree_as_a_process_tree_under_headers() {
        let tree = TreeInfo {
            tree: 3,
            lease: 7,
            owner_uid: 1000,
            root: 10,
            on_root_exit: RootExitPolicy::Kill,
            grace_ms: 2000,
            host_pid: 9,
            host_comm: Some("agent-host".into()),
            root_exited: false,
            state: leash_client::protocol::TreeState::Live,
            nested_in: None,
            member_count: 2,
            members_truncated: false,
            cpu_ms: Some(2500),
            rss_bytes: Some(70 << 20),
            members: vec![
                MemberInfo {
                    pid: 10,
                    parent: 9,
                    start_ns: 0,
                    comm: Some("sh".into()),
                    uid: Some(1000),
                    state: Some('S'),
                    cmdline: Some("sh -c python3 big.py".into()),
                    cpu_ms: Some(0),
                    rss_bytes: Some(6 << 20),
                },
                MemberInfo {
                    pid: 11,
                    parent: 10,
                    start_ns: 60_000_000_000,
                    comm: Some("python3".into()),
                    uid: Some(1000),
                    state: Some('R'),
                    cmdline: Some("python3 big.py".into()),
                    cpu_ms: Some(2500),
                    rss_bytes: Some(64 << 20),
                },
            ],
        };
        let mut listing = Listing {
            trees: vec![tree],
            leases: vec![LeaseSummary {
                lease: 8,
                owner_uid: 1000,
                host_pid: 20,
                host_comm: Some("idle-host".into()),
                trees: 0,
            }],
        };
        let users = Users::default();
        assert_eq!(
            ls_text(&listing, 125_000_000_000, &CpuRates::default(), &users),
            "    PID USER     S  CPU%    RSS    AGE  COMMAND\n\
             tree 3                 -    70M         live  2 members  root 10  \
             host 9 (agent-host)  uid 1000  lease 7\n     \
             10 1000     S     -   6.0M  2m05s  sh -c python3 big.py\n     \
             11 1000     R     -    64M  1m05s    python3 big.py\n\
             lease 8  host 20 (idle-host)  uid 1000  no trees now\n"
        );
        listing.trees.clear();
        assert!(ls_text(&listing, 0, &CpuRates::default(), &users).ends_with("no trees now\n"));
        listing.leases.clear();
        assert_eq!(
            ls_text(&listing, 0, &CpuRates::default(), &users),
            "no trees on a leash\n"
        );
    }

    #[test]
    fn status_tells_hosts_leases_from_other_connections() {
        let status = StatusInfo {
            daemon_version: "0.1.0".into(),
            protocol: 1,
            programs: vec!["fork (tp_btf/sched_process_fork)".into()],
            member_capacity: 131072,
            members: 3,
            tree_capacity: 4096,
            trees: 2,
            leases: 3,
            host_leases: 2,
            events_dropped: 0,
            inserts_failed: 0,
            membership: None,
            pinned_at: None,
            pins_missing: Vec::new(),
        };
        let text = status_text(&status);
        assert!(text.contains("\nno ptrace guard: "), "{text}");
        assert!(
            text.contains("\nhosts' leases: 2\nother connections: 1 (viewers, probes, this one)\n"),
            "{text}"
        );
        let alone = StatusInfo {
            leases: 1,
            host_leases: 0,
            ..status
        };
        assert!(
            status_text(&alone).contains("\nhosts' leases: 0\nother connections: 1 "),
            "{}",
            status_text(&alone)
        );
    }
}
