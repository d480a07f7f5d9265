//! The state of `leash watch` and what keys and events do to it. No terminal here: the view is
//! drawn from this state by `ui`, so it can be tested against known states.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    time::Instant,
};

use leash_client::{
    Event, EventKind, EventReason, LeaseSummary, Listing, StatusInfo, TreeId, TreeInfo,
};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::cli::{
    counts,
    view::{CpuRates, Row, Users, member_rows},
};

/// Log lines kept for the view.
const LOG_LINES: usize = 500;

/// One line of the tree view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Line {
    Lease {
        lease: u64,
        host_pid: u32,
        host_comm: String,
        uid: u32,
        /// It holds no tree now (its host is still there).
        idle: bool,
    },
    Tree {
        tree: TreeId,
        folded: bool,
    },
    Member {
        tree: TreeId,
        row: Row,
    },
}

impl Line {
    fn tree(&self) -> Option<TreeId> {
        match self {
            Line::Lease { .. } => None,
            Line::Tree { tree, .. } | Line::Member { tree, .. } => Some(*tree),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LogLine {
    /// Wall-clock time, as shown.
    pub time: String,
    pub text: String,
    pub about: About,
}

/// What a log line is about, for its style.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum About {
    /// A tree's own life: registered, a fork, an exec, an exit.
    #[default]
    Activity,
    /// A kill: its start, what its processes do until the tree is empty, its end. A process
    /// that forks or exits while its tree dies is the kill at work, not an escape.
    Kill,
}

/// What the run loop must do after a key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    None,
    Quit,
    Kill(TreeId),
}

#[derive(Debug, Default)]
pub(super) struct App {
    pub trees: Vec<TreeInfo>,
    /// The leases that hold or held a tree, from the daemon (empty from an older one).
    pub leases: Vec<LeaseSummary>,
    /// CPU % of each member over the last refresh interval.
    pub cpu: CpuRates,
    pub users: Users,
    /// Process states read from /proc at the last refresh, by pid.
    pub states: std::collections::HashMap<u32, char>,
    pub status: Option<StatusInfo>,
    pub log: VecDeque<LogLine>,
    /// Boot-time ns at the last refresh: ages are computed against it.
    pub now_ns: u64,
    pub events_per_second: f64,
    /// Events this viewer missed because it read too slowly (the daemon never waits for it).
    pub dropped_here: u64,
    pub selected: usize,
    /// Whether the selection was moved by a key: until then it follows the first tree, so
    /// that K kills a tree from the start.
    pub moved: bool,
    /// Whether the event stream was lost: kills are then said from their replies.
    pub events_lost: bool,
    pub folded: HashSet<TreeId>,
    pub filter: String,
    pub typing_filter: bool,
    pub confirm_kill: Option<TreeId>,
    pub message: Option<String>,
    /// Trees whose kill started, until they are empty.
    pub killing: HashSet<TreeId>,
}

impl App {
    /// The lines of the tree view, as folded and filtered now: each lease, then its trees. A
    /// lease whose trees are all gone stays while it lasts (unless a filter is typed).
    pub(super) fn lines(&self) -> Vec<Line> {
        let filter = self.filter.to_lowercase();
        let mut by_lease: BTreeMap<u64, (Option<Line>, Vec<&TreeInfo>)> = BTreeMap::new();
        for lease in &self.leases {
            by_lease.entry(lease.lease).or_default().0 = Some(Line::Lease {
                lease: lease.lease,
                host_pid: lease.host_pid,
                host_comm: host_comm(lease.host_comm.as_deref()),
                uid: lease.owner_uid,
                idle: false,
            });
        }
        for tree in &self.trees {
            by_lease.entry(tree.lease).or_default().1.push(tree);
        }
        let mut lines = Vec::new();
        for (lease, (lease_line, mut trees)) in by_lease {
            trees.sort_by_key(|t| t.tree);
            let mut tree_lines = Vec::new();
            for tree in &trees {
                let mut rows = member_rows(&tree.members, self.now_ns, &self.cpu);
                for row in &mut rows {
                    row.state = row.state.or_else(|| self.states.get(&row.pid).copied());
                }
                if !filter.is_empty() && !rows.iter().any(|r| r.matches(&filter)) {
                    continue;
                }
                let folded = self.folded.contains(&tree.tree);
                tree_lines.push(Line::Tree {
                    tree: tree.tree,
                    folded,
                });
                if !folded {
                    tree_lines.extend(rows.into_iter().map(|row| Line::Member {
                        tree: tree.tree,
                        row,
                    }));
                }
            }
            if tree_lines.is_empty() && !(trees.is_empty() && filter.is_empty()) {
                continue;
            }
            let lease_line = lease_line.or_else(|| {
                trees.first().map(|tree| Line::Lease {
                    lease,
                    host_pid: tree.host_pid,
                    host_comm: host_comm(tree.host_comm.as_deref()),
                    uid: tree.owner_uid,
                    idle: false,
                })
            });
            if let Some(mut line) = lease_line {
                if let Line::Lease { idle, .. } = &mut line {
                    *idle = trees.is_empty();
                }
                lines.push(line);
            }
            lines.extend(tree_lines);
        }
        lines
    }

    pub(super) fn tree(&self, tree: TreeId) -> Option<&TreeInfo> {
        self.trees.iter().find(|t| t.tree == tree)
    }

    /// The tree of the selected line, if any.
    pub(super) fn selected_tree(&self) -> Option<TreeId> {
        let lines = self.lines();
        lines
            .get(self.selected.min(lines.len().saturating_sub(1)))?
            .tree()
    }

    /// The tree K kills: the selected line's, or, on a lease's line, its tree if it has one
    /// only. Else why none.
    fn kill_target(&self) -> Result<TreeId, String> {
        let lines = self.lines();
        let at = self.selected.min(lines.len().saturating_sub(1));
        match lines.get(at) {
            None => Err("no tree to kill".to_owned()),
            Some(Line::Lease { lease, .. }) => {
                let trees: Vec<TreeId> = lines[at + 1..]
                    .iter()
                    .take_while(|line| !matches!(line, Line::Lease { .. }))
                    .filter_map(|line| match line {
                        Line::Tree { tree, .. } => Some(*tree),
                        _ => None,
                    })
                    .collect();
                match trees.as_slice() {
                    [tree] => Ok(*tree),
                    [] => Err(format!("lease {lease} holds no tree")),
                    _ => Err(format!(
                        "lease {lease} holds {} trees: select one",
                        trees.len()
                    )),
                }
            }
            Some(line) => line
                .tree()
                .ok_or_else(|| "select a tree to kill".to_owned()),
        }
    }

    /// Takes a listing that came at `at` (`now_ns` after boot).
    pub(super) fn set_listing(&mut self, listing: Listing, now_ns: u64, at: Instant) {
        self.cpu.sample(&listing.trees, at);
        self.trees = listing.trees;
        self.leases = listing.leases;
        self.now_ns = now_ns;
        self.folded
            .retain(|t| self.trees.iter().any(|tree| tree.tree == *t));
        self.clamp_selection();
    }

    pub(super) fn on_key(&mut self, key: KeyEvent) -> Action {
        // A message lasts until the next key.
        self.message = None;
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(tree) = self.confirm_kill {
            self.confirm_kill = None;
            return match key.code {
                KeyCode::Char('y') | KeyCode::Char('Y') => Action::Kill(tree),
                _ => {
                    self.message = Some(format!("tree {tree} not killed"));
                    Action::None
                }
            };
        }
        if self.typing_filter {
            match key.code {
                KeyCode::Enter => self.typing_filter = false,
                KeyCode::Esc => {
                    self.typing_filter = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => {}
            }
            self.clamp_selection();
            return Action::None;
        }
        match key.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Up | KeyCode::Char('k') => {
                self.moved = true;
                self.selected = self.selected.saturating_sub(1);
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.moved = true;
                self.selected += 1;
            }
            KeyCode::Enter => {
                if let Some(tree) = self.selected_tree()
                    && !self.folded.remove(&tree)
                {
                    self.folded.insert(tree);
                }
            }
            KeyCode::Char('K') => match self.kill_target() {
                Ok(tree) => self.confirm_kill = Some(tree),
                Err(why) => self.message = Some(why),
            },
            KeyCode::Char('/') => {
                self.typing_filter = true;
                self.filter.clear();
            }
            KeyCode::Esc => self.filter.clear(),
            _ => {}
        }
        self.clamp_selection();
        Action::None
    }

    /// Adds an event to the log.
    pub(super) fn on_event(&mut self, event: &Event, time: String) {
        let tree = event.tree;
        let during_kill = self.killing.contains(&tree);
        let about = match event.kind {
            EventKind::Dropped => {
                self.dropped_here += event.count.unwrap_or(0);
                About::Activity
            }
            EventKind::KillStarted => {
                self.killing.insert(tree);
                About::Kill
            }
            EventKind::TreeEmpty | EventKind::Released => {
                self.killing.remove(&tree);
                if during_kill || event.kill.is_some() {
                    About::Kill
                } else {
                    About::Activity
                }
            }
            EventKind::KillFailed => About::Kill,
            _ if during_kill => About::Kill,
            _ => About::Activity,
        };
        self.push_line(time, describe(event, during_kill), about);
    }

    /// A line of ordinary activity, as the view's tests draw known logs.
    #[cfg(test)]
    pub(super) fn push_log(&mut self, time: String, text: String) {
        self.push_line(time, text, About::Activity);
    }

    pub(super) fn push_line(&mut self, time: String, text: String, about: About) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(LogLine { time, text, about });
    }

    /// A kill this view asked for is over: `failed` says why if it failed. Its end is the
    /// event stream's to say (`tree 3: empty, killed in ...`), once; the reply says it only
    /// where that stream is lost.
    pub(super) fn on_kill_done(&mut self, tree: TreeId, failed: Option<String>, time: String) {
        self.message = None;
        let text = match failed {
            Some(why) => format!("tree {tree}: kill failed: {why}"),
            None if self.events_lost => format!("tree {tree}: killed on request"),
            None => return,
        };
        self.push_line(time, text, About::Kill);
    }

    /// The event stream is gone (`why`).
    pub(super) fn on_events_lost(&mut self, why: &str) {
        self.events_lost = true;
        self.message = Some(format!("event stream lost: {why}"));
    }

    fn clamp_selection(&mut self) {
        let lines = self.lines();
        if !self.moved
            && let Some(first_tree) = lines.iter().position(|l| matches!(l, Line::Tree { .. }))
        {
            self.selected = first_tree;
        }
        self.selected = self.selected.min(lines.len().saturating_sub(1));
    }
}

fn host_comm(comm: Option<&str>) -> String {
    comm.unwrap_or("gone").to_owned()
}

/// An event in words, for the log; `during_kill` when its tree's kill has started (a
/// process's fork, exec or exit is then said to be part of it).
pub(super) fn describe(event: &Event, during_kill: bool) -> String {
    let pid = event.pid.map(|p| p.to_string()).unwrap_or_default();
    let comm = event.comm.as_deref().unwrap_or("");
    let tree = event.tree;
    let during = if during_kill { " during the kill" } else { "" };
    let reason = event.reason.as_ref().map_or("?", EventReason::as_str);
    match event.kind {
        EventKind::Registered => format!("tree {tree}: registered, root {pid}"),
        EventKind::Fork => format!(
            "tree {tree}: {} ({comm}) forked {pid}{during}",
            event.parent.unwrap_or_default()
        ),
        EventKind::Exec => format!("tree {tree}: {pid} runs {comm}{during}"),
        EventKind::Exit => format!("tree {tree}: {pid} ({comm}) exited{during}"),
        EventKind::RootExited => format!("tree {tree}: root {pid} exited"),
        EventKind::KillStarted => format!("tree {tree}: kill started ({reason})"),
        EventKind::TreeEmpty => match &event.kill {
            Some(kill) => format!("tree {tree}: empty, {}", counts::kill(kill)),
            None => format!("tree {tree}: empty"),
        },
        EventKind::KillFailed => format!("tree {tree}: kill failed ({reason})"),
        EventKind::Dropped => format!(
            "{} events dropped: this view fell behind",
            event.count.unwrap_or(0)
        ),
        EventKind::Closing => format!("the daemon closes this view's connection ({reason})"),
        EventKind::Refused => format!(
            "process {pid} sent a request on this view's connection: refused ({})",
            event.code.map(|code| code.to_string()).unwrap_or_default()
        ),
        // `released` (`tree 3: released`), and the kinds a newer leash knows: shown in general
        // words, not an error.
        _ => crate::cli::event_words::generic(event),
    }
}

#[cfg(test)]
mod tests;
