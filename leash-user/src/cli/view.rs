//! How trees are shown, shared by `ls` and `watch`: members as an indented process tree, ages.

use std::{collections::HashMap, time::Duration};

use leash_client::MemberInfo;

/// One member, placed in its tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub depth: usize,
    pub pid: u32,
    pub comm: String,
    pub age: Duration,
    /// The /proc state letter (R, S, D, Z, ...), if the process could be read.
    pub state: Option<char>,
}

/// The members as a tree: each under the member that forked it, oldest first; a member whose
/// parent is not a member (the root, or one registered from /proc) starts at depth 0.
pub(super) fn member_rows(members: &[MemberInfo], now_ns: u64) -> Vec<Row> {
    let pids: HashMap<u32, &MemberInfo> = members.iter().map(|m| (m.pid, m)).collect();
    let mut children: HashMap<u32, Vec<&MemberInfo>> = HashMap::new();
    let mut tops = Vec::new();
    for member in members {
        if member.parent != member.pid && pids.contains_key(&member.parent) {
            children.entry(member.parent).or_default().push(member);
        } else {
            tops.push(member);
        }
    }
    let by_start = |list: &mut Vec<&MemberInfo>| list.sort_by_key(|m| (m.start_ns, m.pid));
    by_start(&mut tops);
    children.values_mut().for_each(by_start);

    let mut rows = Vec::with_capacity(members.len());
    let mut stack: Vec<(&MemberInfo, usize)> = tops.into_iter().rev().map(|m| (m, 0)).collect();
    while let Some((member, depth)) = stack.pop() {
        // A pid can only be placed once, whatever the parent links say.
        if rows.len() >= members.len() {
            break;
        }
        rows.push(Row {
            depth,
            pid: member.pid,
            comm: member.comm.clone().unwrap_or_else(|| "?".to_owned()),
            age: Duration::from_nanos(now_ns.saturating_sub(member.start_ns)),
            state: None,
        });
        if let Some(kids) = children.remove(&member.pid) {
            stack.extend(kids.into_iter().rev().map(|m| (m, depth + 1)));
        }
    }
    rows
}

/// `45s`, `3m02s`, `2h05m`, `3d04h`.
pub(super) fn age(duration: Duration) -> String {
    let s = duration.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// A state letter in words.
pub(super) fn state_word(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' => "sleeping",
        'D' => "disk wait",
        'T' | 't' => "stopped",
        'Z' => "zombie",
        'X' => "dead",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pid: u32, parent: u32, start_s: u64, comm: &str) -> MemberInfo {
        MemberInfo {
            pid,
            parent,
            start_ns: start_s * 1_000_000_000,
            comm: Some(comm.to_owned()),
        }
    }

    #[test]
    fn members_nest_under_their_forker() {
        let members = [
            m(12, 10, 3, "python3"),
            m(10, 1, 1, "sh"),
            m(11, 10, 2, "sleep"),
            m(20, 999, 4, "orphan"),
            m(13, 12, 5, "bash"),
        ];
        let rows: Vec<(usize, u32)> = member_rows(&members, 10_000_000_000)
            .iter()
            .map(|r| (r.depth, r.pid))
            .collect();
        assert_eq!(rows, [(0, 10), (1, 11), (1, 12), (2, 13), (0, 20)]);
        assert_eq!(
            member_rows(&members, 10_000_000_000)[0].age,
            Duration::from_secs(9)
        );
    }

    #[test]
    fn a_parent_loop_does_not_hang() {
        let members = [m(1, 2, 0, "a"), m(2, 1, 0, "b")];
        assert!(member_rows(&members, 0).len() <= 2);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(age(Duration::from_secs(45)), "45s");
        assert_eq!(age(Duration::from_secs(182)), "3m02s");
        assert_eq!(age(Duration::from_secs(7500)), "2h05m");
        assert_eq!(age(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d04h");
    }
}
