//! `leash watch`: the live view. Two connections to the daemon: one subscribed to events (read
//! on its own thread), one for `list` and `status` twice a second (CPU % is over that interval). A kill runs on a thread of
//! its own, so the view stays live while the tree dies. The screen is redrawn 20 times a second
//! (ratatui diffs frames, so nothing flickers); resizing just redraws.

mod app;
mod ui;

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::mpsc,
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use clap::Args;
use leash_client::{Client, Event};
use ratatui::crossterm::event::{self as term, Event as TermEvent, KeyEventKind};

use app::{Action, App};

use super::{timestamp, view};

const FRAME: Duration = Duration::from_millis(50);
const REFRESH: Duration = Duration::from_millis(500);

#[derive(Args, Debug)]
pub(super) struct WatchArgs {
    /// Print the events as JSON lines instead of the live view, each with the time it was
    /// read (for scripts and log shippers; see docs/JSON.md). Needs no terminal.
    #[arg(long)]
    json: bool,
}

/// What the background threads tell the view.
enum News {
    Event(Event),
    Lost(String),
    /// A kill asked for is over; why it failed, if it did.
    Killed(u32, Option<String>),
}

pub(super) fn watch(socket: &Path, args: WatchArgs) -> Result<ExitCode> {
    if args.json {
        return watch_json(socket);
    }
    // Before anything else, so that a script or a pipe hears at once what to do instead.
    if !has_terminal() {
        bail!("leash watch needs a terminal; use leash watch --json for a stream of events");
    }
    let mut requests = Client::connect_to(socket)?;
    let (news, inbox) = mpsc::channel();
    subscribe(socket.to_owned(), news.clone())?;

    let mut app = App {
        users: view::Users::from_passwd(),
        ..App::default()
    };
    refresh(&mut app, &mut requests)?;
    let mut terminal = ratatui::try_init().context("starting the terminal view")?;
    let result = run(
        &mut terminal,
        &mut app,
        &mut requests,
        socket,
        &news,
        &inbox,
    );
    ratatui::restore();
    result
}

fn run(
    terminal: &mut ratatui::DefaultTerminal,
    app: &mut App,
    requests: &mut Client,
    socket: &Path,
    news: &mpsc::Sender<News>,
    inbox: &mpsc::Receiver<News>,
) -> Result<ExitCode> {
    let mut last_refresh = Instant::now();
    let mut rate = Rate::default();
    loop {
        for item in inbox.try_iter() {
            match item {
                News::Event(event) => {
                    rate.count();
                    app.on_event(&event, clock());
                }
                News::Lost(why) => app.on_events_lost(&why),
                News::Killed(tree, failed) => app.on_kill_done(tree, failed, clock()),
            }
        }
        app.events_per_second = rate.per_second();
        if last_refresh.elapsed() >= REFRESH {
            refresh(app, requests)?;
            last_refresh = Instant::now();
        }
        terminal.draw(|frame| ui::draw(frame, app))?;
        if !term::poll(FRAME)? {
            continue;
        }
        match term::read()? {
            TermEvent::Key(key) if key.kind == KeyEventKind::Press => match app.on_key(key) {
                Action::Quit => return Ok(ExitCode::SUCCESS),
                Action::Kill(tree) => {
                    app.message = Some(format!("killing tree {tree}..."));
                    kill_in_background(socket.to_owned(), tree, news.clone());
                }
                Action::None => {}
            },
            // A resize needs nothing but the next draw, which comes at once.
            _ => {}
        }
    }
}

fn refresh(app: &mut App, requests: &mut Client) -> Result<()> {
    let listing = requests.listing().context("listing trees")?;
    let at = Instant::now();
    app.status = requests.status().ok();
    // States from this machine's /proc, for a daemon too old to send them.
    app.states = listing
        .trees
        .iter()
        .flat_map(|t| &t.members)
        .filter(|m| m.state.is_none())
        .filter_map(|m| leash::proc::process(m.pid).map(|p| (m.pid, p.state)))
        .collect();
    app.set_listing(listing, leash::proc::boot_time_ns().unwrap_or(0), at);
    Ok(())
}

/// Reads events on a connection of their own, so a burst never holds up the view.
fn subscribe(socket: PathBuf, news: mpsc::Sender<News>) -> Result<()> {
    let mut events = Client::connect_to(&socket)?;
    events.subscribe()?;
    thread::spawn(move || {
        loop {
            match events.next_event(None) {
                Ok(Some(event)) => {
                    if news.send(News::Event(event)).is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let _ = news.send(News::Lost(e.to_string()));
                    return;
                }
            }
        }
    });
    Ok(())
}

fn kill_in_background(socket: PathBuf, tree: u32, news: mpsc::Sender<News>) {
    thread::spawn(move || {
        let outcome = Client::connect_to(&socket).and_then(|mut c| c.kill(tree, None));
        let failed = outcome.err().map(|e| e.to_string());
        let _ = news.send(News::Killed(tree, failed));
    });
}

/// The view draws on stdout and reads keys from stdin or, if that is redirected, from the
/// controlling terminal (as crossterm does).
fn has_terminal() -> bool {
    std::io::stdout().is_terminal()
        && (std::io::stdin().is_terminal() || std::fs::File::open("/dev/tty").is_ok())
}

fn watch_json(socket: &Path) -> Result<ExitCode> {
    let mut events = Client::connect_to(socket)?;
    events.subscribe()?;
    let mut out = super::stdout::lock();
    loop {
        let event = match events.next_event(None) {
            Ok(Some(event)) => event,
            Ok(None) => continue,
            // A line this leash cannot read (an event kind of a newer daemon): the stream goes
            // on.
            Err(leash_client::Error::Protocol(e)) => {
                tracing::warn!(
                    "skipped a line from the daemon this leash does not understand: {e}"
                );
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let line = Stamped {
            event: &event,
            time: timestamp::now(),
        };
        serde_json::to_writer(&mut out, &line)?;
        // Line by line, so a pipe sees each event as it happens.
        writeln!(out)?;
        out.flush()?;
    }
}

/// An event as `leash watch --json` prints it: the protocol's event, and when this command
/// read it from the daemon (docs/JSON.md).
#[derive(serde::Serialize)]
struct Stamped<'a> {
    #[serde(flatten)]
    event: &'a Event,
    time: String,
}

/// Events per second over the last few seconds.
#[derive(Default)]
struct Rate {
    times: std::collections::VecDeque<Instant>,
}

impl Rate {
    const WINDOW: Duration = Duration::from_secs(2);

    fn count(&mut self) {
        self.times.push_back(Instant::now());
        if self.times.len() > 100_000 {
            self.times.pop_front();
        }
    }

    fn per_second(&mut self) -> f64 {
        while self
            .times
            .front()
            .is_some_and(|t| t.elapsed() > Self::WINDOW)
        {
            self.times.pop_front();
        }
        self.times.len() as f64 / Self::WINDOW.as_secs_f64()
    }
}

/// Wall-clock time of day (UTC), to the millisecond.
fn clock() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() % 86400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        now.subsec_millis()
    )
}
