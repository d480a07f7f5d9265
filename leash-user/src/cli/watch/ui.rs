//! Drawing `leash watch` from its state: a header of counters, the leases with their trees as
//! indented process trees under column headers, the event log, and a line of keys (or the
//! prompt of the moment).

use ratatui::{
    Frame,
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    text::Line as TextLine,
    widgets::{Block, Borders, List, ListItem, ListState, Paragraph},
};

use super::app::{About, App, Line};
use crate::cli::{counts, view};

const KEYS: &str = "↑↓/jk move  enter fold  K kill tree  / filter  q quit";

pub(super) fn draw(frame: &mut Frame<'_>, app: &App) {
    // The trees get most of the screen; the log a third, within bounds.
    let log_height = (frame.area().height / 3).clamp(3, 12);
    let [header, trees, log, footer] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(2),
        Constraint::Length(log_height),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    frame.render_widget(Paragraph::new(header_lines(app)), header);

    let block = Block::default().borders(Borders::TOP).title(" trees ");
    let [columns, rows] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(block.inner(trees));
    frame.render_widget(block, trees);
    frame.render_widget(Paragraph::new(view::HEADER), columns);
    let lines = app.lines();
    let items: Vec<ListItem<'_>> = lines
        .iter()
        .map(|l| ListItem::new(line_text(app, l)))
        .collect();
    let list = List::new(items).highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = ListState::default().with_selected((!lines.is_empty()).then_some(app.selected));
    frame.render_stateful_widget(list, rows, &mut state);

    let visible = log.height.saturating_sub(1) as usize;
    let events: Vec<TextLine<'_>> = app
        .log
        .iter()
        .skip(app.log.len().saturating_sub(visible))
        .map(|l| TextLine::styled(format!("{} {}", l.time, l.text), log_style(l.about)))
        .collect();
    frame.render_widget(
        Paragraph::new(events).block(Block::default().borders(Borders::TOP).title(" events ")),
        log,
    );

    frame.render_widget(Paragraph::new(footer_text(app)), footer);
}

/// A kill's lines stand out from the trees' ordinary activity.
fn log_style(about: About) -> Style {
    match about {
        About::Activity => Style::default(),
        About::Kill => Style::default().fg(Color::Yellow),
    }
}

fn header_lines(app: &App) -> Vec<TextLine<'static>> {
    let members: usize = app.trees.iter().map(|t| t.member_count as usize).sum();
    let (kernel_dropped, fill) = match &app.status {
        Some(s) => (
            s.events_dropped.to_string(),
            format!("{}/{}", s.members, s.member_capacity),
        ),
        None => ("?".to_owned(), "?".to_owned()),
    };
    vec![
        TextLine::from(format!(
            "leash watch   trees {}   members {members}   events/s {:.0}",
            app.trees.len(),
            app.events_per_second
        )),
        TextLine::from(format!(
            "dropped: {kernel_dropped} in the kernel, {} in this view   map {fill}",
            app.dropped_here
        )),
    ]
}

fn line_text(app: &App, line: &Line) -> String {
    match line {
        Line::Lease {
            lease,
            host_pid,
            host_comm,
            uid,
            idle,
        } => {
            let idle = if *idle { "  no trees now" } else { "" };
            format!("lease {lease}  host {host_pid} {host_comm}  uid {uid}{idle}")
        }
        Line::Tree { tree, folded } => {
            let marker = if *folded { '▸' } else { '▾' };
            let label = format!("{marker} tree {tree}");
            match app.tree(*tree) {
                Some(info) => view::tree_line(&label, info, app.cpu.of_tree(info)),
                None => label,
            }
        }
        Line::Member { row, .. } => view::member_line(row, &app.users),
    }
}

fn footer_text(app: &App) -> String {
    if let Some(tree) = app.confirm_kill {
        let members = app.tree(tree).map_or(0, |t| t.member_count);
        return format!(
            "Kill tree {tree} ({})? y/n",
            counts::count(members, "member", "members")
        );
    }
    if app.typing_filter {
        return format!("/{}", app.filter);
    }
    if let Some(message) = &app.message {
        return message.clone();
    }
    if !app.filter.is_empty() {
        return format!("filter: {}  (esc clears)   {KEYS}", app.filter);
    }
    KEYS.to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use leash_client::{LeaseSummary, Listing, MemberInfo, RootExitPolicy, StatusInfo, TreeInfo};
    use ratatui::{
        Terminal,
        backend::TestBackend,
        crossterm::event::{KeyCode, KeyEvent},
    };

    use super::*;
    use crate::cli::watch::app::Action;

    const S: u64 = 1_000_000_000;

    fn tree(tree: u32, lease: u64, members: Vec<MemberInfo>) -> TreeInfo {
        TreeInfo {
            tree,
            lease,
            owner_uid: 1000,
            root: members[0].pid,
            on_root_exit: RootExitPolicy::Kill,
            grace_ms: 2000,
            host_pid: 900 + lease as u32,
            host_comm: Some("agent-host".into()),
            root_exited: false,
            state: leash_client::protocol::TreeState::Live,
            nested_in: None,
            member_count: members.len() as u64,
            members_truncated: false,
            cpu_ms: Some(members.iter().filter_map(|m| m.cpu_ms).sum()),
            rss_bytes: Some(members.iter().filter_map(|m| m.rss_bytes).sum()),
            members,
        }
    }

    fn member(pid: u32, parent: u32, start_s: u64, comm: &str) -> MemberInfo {
        MemberInfo {
            pid,
            parent,
            start_ns: start_s * S,
            comm: Some(comm.into()),
            uid: Some(1000),
            state: Some('S'),
            cmdline: Some(format!("{comm} --flag")),
            cpu_ms: Some(0),
            rss_bytes: Some(2 << 20),
        }
    }

    fn status(members: u64) -> StatusInfo {
        StatusInfo {
            daemon_version: "0.1.0".into(),
            protocol: 1,
            programs: vec![],
            member_capacity: 131072,
            members,
            tree_capacity: 4096,
            trees: 1,
            leases: 1,
            host_leases: 1,
            events_dropped: 0,
            inserts_failed: 0,
            membership: None,
            pinned_at: None,
            pins_missing: Vec::new(),
        }
    }

    fn render(app: &App, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| draw(frame, app)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..width)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    fn listing(trees: Vec<TreeInfo>) -> Listing {
        Listing {
            trees,
            leases: Vec::new(),
        }
    }

    fn small() -> App {
        let mut app = App::default();
        let members = |busy_ms| {
            vec![
                member(4242, 4100, 100, "bash"),
                MemberInfo {
                    state: Some('R'),
                    cpu_ms: Some(busy_ms),
                    rss_bytes: Some(64 << 20),
                    ..member(4250, 4242, 160, "python3")
                },
                MemberInfo {
                    state: None,
                    ..member(4251, 4250, 190, "sleep")
                },
            ]
        };
        let start = Instant::now();
        app.set_listing(listing(vec![tree(3, 7, members(1000))]), 219 * S, start);
        app.set_listing(
            listing(vec![tree(3, 7, members(1500))]),
            220 * S,
            start + Duration::from_millis(500),
        );
        // No state from the daemon: the one read here shows.
        app.states.insert(4251, 'S');
        app.status = Some(status(3));
        app.events_per_second = 2.0;
        app.push_log(
            "12:00:01.000".into(),
            "tree 3: registered, root 4242".into(),
        );
        app.push_log(
            "12:00:02.500".into(),
            "tree 3: 4242 (bash) forked 4250".into(),
        );
        app
    }

    #[test]
    fn a_small_tree() {
        let screen = render(&small(), 70, 16);
        let expected = [
            "leash watch   trees 1   members 3   events/s 2",
            "dropped: 0 in the kernel, 0 in this view   map 3/131072",
            " trees ───────────────────────────────────────────────────────────────",
            "    PID USER     S  CPU%    RSS    AGE  COMMAND",
            "lease 7  host 907 agent-host  uid 1000",
            "▾ tree 3           100.0    68M         live  3 members  root 4242",
            "   4242 1000     S   0.0   2.0M  2m00s  bash --flag",
            "   4250 1000     R 100.0    64M  1m00s    python3 --flag",
            "   4251 1000     S   0.0   2.0M    30s      sleep --flag",
            "",
            " events ──────────────────────────────────────────────────────────────",
            "12:00:01.000 tree 3: registered, root 4242",
            "12:00:02.500 tree 3: 4242 (bash) forked 4250",
            "",
            "",
            "↑↓/jk move  enter fold  K kill tree  / filter  q quit",
        ];
        assert_eq!(screen, expected);
    }

    #[test]
    fn a_fork_storm() {
        let mut app = App::default();
        let mut members = vec![member(5000, 1, 0, "sh")];
        members.extend((1..=400).map(|i| member(5000 + i, 5000, 1, "stress")));
        app.set_listing(listing(vec![tree(9, 2, members)]), 10 * S, Instant::now());
        app.status = Some(StatusInfo {
            events_dropped: 1234,
            ..status(401)
        });
        app.events_per_second = 9876.0;
        app.dropped_here = 5120;
        for i in 0..100 {
            app.push_log(
                format!("12:00:{:02}.000", i % 60),
                format!("tree 9: 5000 (sh) forked {}", 6000 + i),
            );
        }
        let screen = render(&app, 64, 16);
        assert_eq!(
            screen[0],
            "leash watch   trees 1   members 401   events/s 9876"
        );
        assert_eq!(
            screen[1],
            "dropped: 1234 in the kernel, 5120 in this view   map 401/131072"
        );
        assert_eq!(screen[3], "    PID USER     S  CPU%    RSS    AGE  COMMAND");
        assert_eq!(
            screen[5],
            "▾ tree 9               -   802M         live  401 members  root"
        );
        assert_eq!(
            screen[6],
            "   5000 1000     S     -   2.0M    10s  sh --flag"
        );
        assert_eq!(
            screen[7],
            "   5001 1000     S     -   2.0M     9s    stress --flag"
        );
        // The log shows the newest lines that fit, and the keys stay on the last line.
        assert_eq!(screen[14], "12:00:39.000 tree 9: 5000 (sh) forked 6099");
        assert_eq!(
            screen[15],
            "↑↓/jk move  enter fold  K kill tree  / filter  q quit"
        );
    }

    #[test]
    fn keys_fold_filter_and_ask_before_killing() {
        let key = |app: &mut App, code| app.on_key(KeyEvent::from(code));
        let mut app = small();
        key(&mut app, KeyCode::Down);
        key(&mut app, KeyCode::Enter);
        assert_eq!(
            render(&app, 70, 16)[5],
            "▸ tree 3           100.0    68M         live  3 members  root 4242"
        );
        assert_eq!(render(&app, 70, 16)[6], "");
        key(&mut app, KeyCode::Enter);

        key(&mut app, KeyCode::Char('/'));
        for c in "pyth".chars() {
            key(&mut app, KeyCode::Char(c));
        }
        assert_eq!(render(&app, 70, 16)[15], "/pyth");
        key(&mut app, KeyCode::Enter);
        assert_eq!(app.lines().len(), 5, "the tree with a match stays");
        key(&mut app, KeyCode::Char('/'));
        for c in "nomatch".chars() {
            key(&mut app, KeyCode::Char(c));
        }
        assert!(app.lines().is_empty());
        key(&mut app, KeyCode::Esc);

        // On the lease's line: its one tree.
        assert_eq!(app.selected, 0);
        assert_eq!(key(&mut app, KeyCode::Char('K')), Action::None);
        assert_eq!(render(&app, 70, 16)[15], "Kill tree 3 (3 members)? y/n");
        assert_eq!(key(&mut app, KeyCode::Char('n')), Action::None);
        assert_eq!(render(&app, 70, 16)[15], "tree 3 not killed");
        key(&mut app, KeyCode::Char('j'));
        assert_eq!(key(&mut app, KeyCode::Char('K')), Action::None);
        assert_eq!(render(&app, 70, 16)[15], "Kill tree 3 (3 members)? y/n");
        assert_eq!(key(&mut app, KeyCode::Char('n')), Action::None);
        assert_eq!(key(&mut app, KeyCode::Char('K')), Action::None);
        assert_eq!(key(&mut app, KeyCode::Char('y')), Action::Kill(3));
        assert_eq!(key(&mut app, KeyCode::Char('q')), Action::Quit);
    }

    #[test]
    fn a_lease_without_trees_stays_while_its_host_lives() {
        let mut app = small();
        let lease = |lease, trees| LeaseSummary {
            lease,
            owner_uid: 1000,
            host_pid: 900 + lease as u32,
            host_comm: Some("agent-host".into()),
            trees,
        };
        let trees = app.trees.clone();
        app.set_listing(
            Listing {
                trees,
                leases: vec![lease(7, 1), lease(8, 0)],
            },
            220 * S,
            Instant::now(),
        );
        let screen = render(&app, 70, 16);
        assert_eq!(screen[4], "lease 7  host 907 agent-host  uid 1000");
        assert_eq!(
            screen[9],
            "lease 8  host 908 agent-host  uid 1000  no trees now"
        );
        app.filter = "pyth".into();
        assert_eq!(app.lines().len(), 5, "a filter shows only matching trees");
    }

    /// K works from the start: the selection begins on the first tree, not on its lease.
    #[test]
    fn the_selection_starts_on_a_tree_and_k_asks_to_kill_it() {
        let mut app = App::default();
        app.set_listing(
            listing(vec![tree(5, 2, vec![member(6000, 1, 0, "sh")])]),
            10 * S,
            Instant::now(),
        );
        assert_eq!(app.selected_tree(), Some(5));
        assert_eq!(app.on_key(KeyEvent::from(KeyCode::Char('K'))), Action::None);
        assert_eq!(render(&app, 70, 16)[15], "Kill tree 5 (1 member)? y/n");
        assert_eq!(
            app.on_key(KeyEvent::from(KeyCode::Char('y'))),
            Action::Kill(5)
        );
    }

    #[test]
    fn k_on_a_lease_with_several_trees_asks_for_one() {
        let mut app = App::default();
        app.set_listing(
            listing(vec![
                tree(5, 2, vec![member(6000, 1, 0, "sh")]),
                tree(6, 2, vec![member(6001, 1, 0, "sh")]),
            ]),
            10 * S,
            Instant::now(),
        );
        app.on_key(KeyEvent::from(KeyCode::Up));
        assert_eq!(app.selected, 0, "the lease's line");
        assert_eq!(app.on_key(KeyEvent::from(KeyCode::Char('K'))), Action::None);
        assert_eq!(app.confirm_kill, None);
        assert_eq!(
            render(&app, 70, 16)[15],
            "lease 2 holds 2 trees: select one"
        );
    }

    #[test]
    fn a_tiny_terminal_does_not_panic() {
        for (w, h) in [(1, 1), (10, 3), (20, 8), (0, 0)] {
            render(&small(), w, h);
        }
    }
}
