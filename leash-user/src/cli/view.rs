//! How trees are shown, shared by `ls` and `watch`: members as an indented process tree under
//! column headers (pid, user, state, CPU %, resident memory, age, command line), each tree's
//! totals, ages, and CPU % from two listings.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use leash_client::{MemberInfo, TreeInfo};

/// The column headers; [`member_line`] and [`tree_line`] fill the columns.
pub(super) const HEADER: &str = "    PID USER     S  CPU%    RSS    AGE  COMMAND";
/// The width of the columns before CPU%: a tree's label takes their place.
const LABEL_WIDTH: usize = 18;

/// One member, placed in its tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub depth: usize,
    pub pid: u32,
    pub start_ns: u64,
    /// What `ls` and `watch` show in the COMMAND column: the command line, else `[comm]`.
    pub command: String,
    pub uid: Option<u32>,
    pub age: Duration,
    /// The /proc state letter (R, S, D, Z, ...), if the process could be read.
    pub state: Option<char>,
    /// CPU use over the last interval, in tenths of a percent of one CPU, once sampled twice.
    pub cpu_tenths: Option<u64>,
    pub rss_bytes: Option<u64>,
}

impl Row {
    /// Whether a filter typed in `watch` (lowercase) matches the row.
    pub(super) fn matches(&self, filter: &str) -> bool {
        self.command.to_lowercase().contains(filter) || self.pid.to_string().contains(filter)
    }
}

/// The members as a tree: each under the member that forked it, oldest first; a member whose
/// parent is not a member (the root, or one registered from /proc) starts at depth 0. CPU % is
/// `cpu`'s, where it has one.
pub(super) fn member_rows(members: &[MemberInfo], now_ns: u64, cpu: &CpuRates) -> Vec<Row> {
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
            start_ns: member.start_ns,
            command: command(member),
            uid: member.uid,
            age: Duration::from_nanos(now_ns.saturating_sub(member.start_ns)),
            state: member.state,
            cpu_tenths: cpu.of(member),
            rss_bytes: member.rss_bytes,
        });
        if let Some(kids) = children.remove(&member.pid) {
            stack.extend(kids.into_iter().rev().map(|m| (m, depth + 1)));
        }
    }
    rows
}

/// The command line, as `ps` shows it: argv, else the name in brackets (a zombie has no argv
/// left); `?` for a process gone.
fn command(member: &MemberInfo) -> String {
    match (&member.cmdline, &member.comm) {
        (Some(cmdline), _) => cmdline.clone(),
        (None, Some(comm)) => format!("[{comm}]"),
        (None, None) => "?".to_owned(),
    }
}

/// A member's line under [`HEADER`], its command indented by its depth in the tree.
pub(super) fn member_line(row: &Row, users: &Users) -> String {
    let user = row
        .uid
        .map_or_else(|| "?".to_owned(), |uid| users.name(uid));
    format!(
        "{:>7} {:<8} {} {:>5} {:>6} {:>6}  {}{}",
        row.pid,
        clip(&user, 8),
        row.state.unwrap_or('?'),
        percent(row.cpu_tenths),
        bytes(row.rss_bytes),
        age(row.age),
        "  ".repeat(row.depth),
        row.command,
    )
}

/// A tree's line under [`HEADER`]: `label` (`tree 3`) in the place of pid and user, its totals
/// under CPU% and RSS, and what it is in the place of the command. Its totals are of the listed
/// members, and say so when some are not listed.
pub(super) fn tree_line(label: &str, tree: &TreeInfo, cpu_tenths: Option<u64>) -> String {
    let mut about = format!(
        "{}  {}",
        tree.state,
        super::counts::count(tree.member_count, "member", "members")
    );
    if tree.members_truncated {
        about += &format!(" (totals of the {} listed)", tree.members.len());
    }
    about += &format!("  root {}", tree.root);
    if tree.root_exited {
        about += " (exited)";
    }
    if let Some(outer) = tree.nested_in {
        about += &format!("  nested in tree {outer}");
    }
    format!(
        "{:<width$} {:>5} {:>6} {:>6}  {about}",
        clip(label, LABEL_WIDTH),
        percent(cpu_tenths),
        bytes(tree.rss_bytes),
        "",
        width = LABEL_WIDTH,
    )
}

/// At most `width` characters of `line` (the terminal's width: a longer line would wrap).
pub(super) fn fit(line: &str, width: usize) -> String {
    line.chars().take(width).collect()
}

/// `text` in at most `width` characters, a `+` marking a cut (as `ps` marks a long user name).
fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
    clipped.push('+');
    clipped
}

/// Tenths of a percent as `99.8`; whole percents from 1000 up; `-` when not sampled yet.
fn percent(tenths: Option<u64>) -> String {
    match tenths {
        None => "-".to_owned(),
        Some(t) if t >= 10_000 => format!("{}", t / 10),
        Some(t) => format!("{}.{}", t / 10, t % 10),
    }
}

/// Resident memory as `812K`, `3.1M`, `64M`, `1.5G`; `-` when unknown.
fn bytes(bytes: Option<u64>) -> String {
    const K: u64 = 1024;
    match bytes {
        None => "-".to_owned(),
        Some(b) if b < 1000 * K => format!("{}K", b / K),
        Some(b) if b < 10 * K * K => format!("{:.1}M", b as f64 / (K * K) as f64),
        Some(b) if b < 1000 * K * K => format!("{}M", b / (K * K)),
        Some(b) => format!("{:.1}G", b as f64 / (K * K * K) as f64),
    }
}

/// CPU use between two listings, per process: (CPU time used) / (wall time passed) x 100,
/// where the process (pid and start time) is in both.
#[derive(Debug, Default)]
pub(super) struct CpuRates {
    /// The previous listing's CPU times, and when it came.
    previous: HashMap<(u32, u64), u64>,
    at: Option<Instant>,
    /// Tenths of a percent, by process.
    rates: HashMap<(u32, u64), u64>,
}

impl CpuRates {
    /// Takes a listing that came at `at`: the rates are from the one before to this one.
    pub(super) fn sample(&mut self, trees: &[TreeInfo], at: Instant) {
        let wall_us = self
            .at
            .map(|then| at.saturating_duration_since(then).as_micros() as u64)
            .filter(|&us| us > 0);
        let mut now = HashMap::new();
        self.rates.clear();
        for member in trees.iter().flat_map(|t| &t.members) {
            let Some(cpu_ms) = member.cpu_ms else {
                continue;
            };
            let process = (member.pid, member.start_ns);
            if let (Some(wall_us), Some(&before)) = (wall_us, self.previous.get(&process)) {
                let used_us = cpu_ms.saturating_sub(before).saturating_mul(1000);
                self.rates
                    .insert(process, used_us.saturating_mul(1000) / wall_us);
            }
            now.insert(process, cpu_ms);
        }
        self.previous = now;
        self.at = Some(at);
    }

    /// The member's rate, in tenths of a percent of one CPU.
    pub(super) fn of(&self, member: &MemberInfo) -> Option<u64> {
        self.rates.get(&(member.pid, member.start_ns)).copied()
    }

    /// The sum of the listed members' rates; None when none has one.
    pub(super) fn of_tree(&self, tree: &TreeInfo) -> Option<u64> {
        let rates: Vec<u64> = tree.members.iter().filter_map(|m| self.of(m)).collect();
        (!rates.is_empty()).then(|| rates.iter().sum())
    }
}

/// User names by uid, from this machine's /etc/passwd (read once); a uid it does not name
/// shows as its number. The uids are the daemon's (the initial user namespace's).
#[derive(Debug, Default)]
pub(super) struct Users {
    names: HashMap<u32, String>,
}

impl Users {
    pub(super) fn from_passwd() -> Self {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        Self::parse(&passwd)
    }

    fn parse(passwd: &str) -> Self {
        let mut names = HashMap::new();
        for line in passwd.lines() {
            let mut fields = line.split(':');
            if let (Some(name), Some(_), Some(uid)) = (fields.next(), fields.next(), fields.next())
                && let Ok(uid) = uid.parse()
            {
                names.entry(uid).or_insert_with(|| name.to_owned());
            }
        }
        Self { names }
    }

    pub(super) fn name(&self, uid: u32) -> String {
        self.names
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pid: u32, parent: u32, start_s: u64, comm: &str) -> MemberInfo {
        MemberInfo {
            pid,
            parent,
            start_ns: start_s * 1_000_000_000,
            comm: Some(comm.to_owned()),
            ..MemberInfo::default()
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
        let rows: Vec<(usize, u32)> = member_rows(&members, 10_000_000_000, &CpuRates::default())
            .iter()
            .map(|r| (r.depth, r.pid))
            .collect();
        assert_eq!(rows, [(0, 10), (1, 11), (1, 12), (2, 13), (0, 20)]);
        assert_eq!(
            member_rows(&members, 10_000_000_000, &CpuRates::default())[0].age,
            Duration::from_secs(9)
        );
    }

    #[test]
    fn a_parent_loop_does_not_hang() {
        let members = [m(1, 2, 0, "a"), m(2, 1, 0, "b")];
        assert!(member_rows(&members, 0, &CpuRates::default()).len() <= 2);
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(age(Duration::from_secs(45)), "45s");
        assert_eq!(age(Duration::from_secs(182)), "3m02s");
        assert_eq!(age(Duration::from_secs(7500)), "2h05m");
        assert_eq!(age(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d04h");
    }

    #[test]
    fn cpu_is_the_time_used_over_the_time_passed() {
        let tree = |busy_ms: u64, idle_ms: u64| TreeInfo {
            members: vec![
                MemberInfo {
                    pid: 10,
                    cpu_ms: Some(busy_ms),
                    ..m(10, 1, 1, "busy")
                },
                MemberInfo {
                    pid: 11,
                    cpu_ms: Some(idle_ms),
                    ..m(11, 10, 2, "idle")
                },
            ],
            ..serde_json::from_str(
                r#"{"tree":1,"lease":1,"owner_uid":0,"root":10,"on_root_exit":"kill","grace_ms":0,
                "host_pid":1,"host_comm":null,"root_exited":false,"state":"live","members":[]}"#,
            )
            .unwrap()
        };
        let mut cpu = CpuRates::default();
        let start = Instant::now();
        cpu.sample(&[tree(1000, 50)], start);
        assert_eq!(cpu.of_tree(&tree(0, 0)), None, "one sample is no rate");
        cpu.sample(&[tree(1490, 50)], start + Duration::from_millis(500));
        let later = tree(1490, 50);
        assert_eq!(cpu.of(&later.members[0]), Some(980));
        assert_eq!(cpu.of(&later.members[1]), Some(0));
        assert_eq!(cpu.of_tree(&later), Some(980));
        let row = &member_rows(&later.members, 3_000_000_000, &cpu)[0];
        let users = Users::parse("root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/a:/bin/sh\n");
        let line = member_line(
            &Row {
                uid: Some(1000),
                rss_bytes: Some(64 << 20),
                state: Some('R'),
                command: "sh -c while :; do :; done".into(),
                ..row.clone()
            },
            &users,
        );
        assert_eq!(
            line,
            "     10 alice    R  98.0    64M     2s  sh -c while :; do :; done"
        );
        assert_eq!(
            tree_line("▾ tree 1", &later, cpu.of_tree(&later)),
            "▾ tree 1            98.0      -         live  0 members  root 10"
        );
        let one = TreeInfo {
            member_count: 1,
            ..later.clone()
        };
        assert!(
            tree_line("tree 1", &one, None).contains("live  1 member  root 10"),
            "{}",
            tree_line("tree 1", &one, None)
        );
    }

    #[test]
    fn figures_read_short() {
        assert_eq!(percent(Some(5)), "0.5");
        assert_eq!(percent(Some(12_345)), "1234");
        assert_eq!(bytes(Some(812 * 1024)), "812K");
        assert_eq!(bytes(Some(3_250_000)), "3.1M");
        assert_eq!(bytes(Some(3 << 30)), "3.0G");
        assert_eq!(clip("averylongname", 8), "averylo+");
        assert_eq!(
            Users::parse("bad line\nbob:x:1001:1001::/:/bin/sh").name(1001),
            "bob"
        );
        assert_eq!(Users::default().name(4242), "4242");
    }
}
