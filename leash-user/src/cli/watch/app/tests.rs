//! The live view's state as keys and events change it, without a terminal.

use leash_client::{KillSummary, protocol::KillReason};

use super::*;

fn event(kind: EventKind, pid: Option<u32>, comm: &str) -> Event {
    let mut event = Event::new(kind, 3, 7, pid);
    event.comm = (!comm.is_empty()).then(|| comm.to_owned());
    event
}

fn last(app: &App) -> (&str, About) {
    let line = app.log.back().expect("a log line");
    (&line.text, line.about)
}

#[test]
fn what_a_tree_does_while_it_is_killed_is_part_of_the_kill() {
    let mut app = App::default();
    let at = || "12:00:00.000".to_owned();
    app.on_event(&event(EventKind::Exit, Some(4250), "sleep"), at());
    assert_eq!(last(&app), ("tree 3: 4250 (sleep) exited", About::Activity));

    app.on_event(&Event::kill_started(3, 7, KillReason::Request), at());
    assert_eq!(last(&app), ("tree 3: kill started (request)", About::Kill));
    app.on_event(&event(EventKind::Fork, Some(4260), "bash"), at());
    assert_eq!(last(&app).1, About::Kill);
    assert!(
        last(&app).0.ends_with("forked 4260 during the kill"),
        "{:?}",
        last(&app)
    );
    app.on_event(&event(EventKind::Exit, Some(4251), "sleep"), at());
    assert_eq!(
        last(&app),
        ("tree 3: 4251 (sleep) exited during the kill", About::Kill)
    );
    // Another tree's life goes on as it was.
    let mut other = event(EventKind::Exit, Some(5000), "make");
    other.tree = 4;
    app.on_event(&other, at());
    assert_eq!(last(&app), ("tree 4: 5000 (make) exited", About::Activity));

    let mut empty = event(EventKind::TreeEmpty, None, "");
    empty.kill = Some(KillSummary {
        tree: 3,
        terminated: 2,
        killed: 0,
        rounds: 0,
        elapsed_ms: 4,
        reason: KillReason::Request,
    });
    app.on_event(&empty, at());
    assert_eq!(last(&app).1, About::Kill);
    assert!(app.killing.is_empty());
}

/// A kill asked for from the view ends in one line, the event's, not also its reply's.
#[test]
fn a_kill_s_end_is_said_once() {
    let mut app = App::default();
    let at = || "12:00:00.000".to_owned();
    let mut empty = event(EventKind::TreeEmpty, None, "");
    empty.kill = Some(KillSummary {
        tree: 3,
        terminated: 1,
        killed: 0,
        rounds: 1,
        elapsed_ms: 12,
        reason: KillReason::Request,
    });
    app.on_event(&empty, at());
    app.on_kill_done(3, None, at());
    let ends: Vec<&str> = app
        .log
        .iter()
        .map(|line| line.text.as_str())
        .filter(|text| text.contains("empty") || text.contains("killed"))
        .collect();
    assert_eq!(
        ends,
        ["tree 3: empty, killed in 12 ms: SIGTERM to 1 process, which ended within the grace"]
    );
    // Where the events are lost, and where the kill failed, the reply is all there is.
    app.on_kill_done(4, Some("no tree 4".into()), at());
    assert_eq!(last(&app), ("tree 4: kill failed: no tree 4", About::Kill));
    app.on_events_lost("closed");
    app.on_kill_done(5, None, at());
    assert_eq!(last(&app), ("tree 5: killed on request", About::Kill));
}
