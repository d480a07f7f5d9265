//! `leash ls` and `leash status`: what is on a leash now, for people and (with --json) scripts.
//! The JSON shapes are the protocol's (docs/JSON.md).

use std::{io::Write, path::Path, process::ExitCode};

use anyhow::Result;
use clap::Args;
use leash_client::{Client, StatusInfo, TreeInfo};

use super::view::{self, member_rows};

#[derive(Args, Debug)]
pub(super) struct ShowArgs {
    /// Print JSON (one document) instead of text.
    #[arg(long)]
    json: bool,
}

pub(super) fn ls(socket: &Path, args: ShowArgs) -> Result<ExitCode> {
    let trees = Client::connect_to(socket)?.list()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &trees)?;
        writeln!(out)?;
    } else {
        write!(
            out,
            "{}",
            ls_text(&trees, leash::proc::boot_time_ns().unwrap_or(0))
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn status(socket: &Path, args: ShowArgs) -> Result<ExitCode> {
    let status = Client::connect_to(socket)?.status()?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &status)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", status_text(&status))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn ls_text(trees: &[TreeInfo], now_ns: u64) -> String {
    if trees.is_empty() {
        return "no trees on a leash\n".to_owned();
    }
    let mut text = String::new();
    for tree in trees {
        text += &format!(
            "tree {}{}  root {}  host {} ({})  uid {}  lease {}  {}{}  {} members\n",
            tree.tree,
            tree.nested_in
                .map(|outer| format!(" (nested in tree {outer})"))
                .unwrap_or_default(),
            tree.root,
            tree.host_pid,
            tree.host_comm.as_deref().unwrap_or("gone"),
            tree.owner_uid,
            tree.lease,
            tree.state,
            if tree.root_exited {
                ", root exited"
            } else {
                ""
            },
            tree.member_count,
        );
        for row in member_rows(&tree.members, now_ns) {
            let indent = "  ".repeat(row.depth + 1);
            text += &format!(
                "{indent}{:<7} {:<16} {}\n",
                row.pid,
                row.comm,
                view::age(row.age)
            );
        }
        if tree.members_truncated {
            let more = tree.member_count.saturating_sub(tree.members.len() as u64);
            text += &format!("  ... and {more} more members, not listed\n");
        }
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
    text += &match &status.pinned_at {
        Some(dir) => format!("pinned at {dir}: tracking goes on if the daemon dies\n"),
        None => "not pinned: tracking ends with the daemon\n".to_owned(),
    };
    text
}

#[cfg(test)]
mod tests {
    use leash_client::{MemberInfo, RootExitPolicy};

    use super::*;

    #[test]
    fn ls_shows_each_tree_as_a_process_tree() {
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
            members: vec![
                MemberInfo {
                    pid: 10,
                    parent: 9,
                    start_ns: 0,
                    comm: Some("sh".into()),
                },
                MemberInfo {
                    pid: 11,
                    parent: 10,
                    start_ns: 60_000_000_000,
                    comm: Some("python3".into()),
                },
            ],
        };
        assert_eq!(
            ls_text(&[tree], 125_000_000_000),
            "tree 3  root 10  host 9 (agent-host)  uid 1000  lease 7  live  2 members\n  \
             10      sh               2m05s\n    11      python3          1m05s\n"
        );
        assert_eq!(ls_text(&[], 0), "no trees on a leash\n");
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
            pinned_at: None,
        };
        let text = status_text(&status);
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
