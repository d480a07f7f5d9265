//! `leash track`: follow one tree live with the programs loaded in this process (no daemon).

use std::{
    collections::HashSet,
    io::{self, Write},
    process::{Command, ExitCode},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::Args;
use leash::{Capacity, Tracker, TreeEvent, TreeStatus, kernel::GuardChoice};
use leash_common::{EventKind, Pid};

#[derive(Args, Debug)]
pub(super) struct TrackArgs {
    /// Adopt this running process and its existing descendants instead of starting CMD.
    #[arg(long, conflicts_with = "command", required_unless_present = "command")]
    pid: Option<Pid>,
    /// How many processes can be tracked at once.
    #[arg(long, default_value_t = Capacity::default().members)]
    max_members: u32,
    /// The command to start as the root of the tree (after `--`, or as it is: `leash track
    /// make -j4`; the options of `leash track` come before it).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

pub(super) fn track(args: TrackArgs) -> Result<ExitCode> {
    let capacity = Capacity {
        members: args.max_members,
        // The guard SIGKILLs (or refuses) a member's ptrace of a process outside its tree:
        // tracking kills nothing, and guards nothing.
        ptrace_guard: GuardChoice::Off,
        ..Capacity::default()
    };
    let mut tracker = Tracker::load(capacity)?;
    let (tree, mut child) = match (args.pid, args.command.split_first()) {
        (Some(pid), _) => (tracker.adopt(pid)?, None),
        (None, Some((program, rest))) => {
            let (tree, child) = tracker.spawn(Command::new(program).args(rest))?;
            (tree, Some(child))
        }
        (None, None) => bail!("give a command to start (leash track CMD...), or --pid"),
    };
    // Members listed now may also have fork events waiting (they forked since registration):
    // each process is shown joining once.
    let mut shown = HashSet::new();
    let mut out = super::stdout::lock();
    // The root first, as started: on a busy machine a short CMD can be gone before the map is
    // read, and its exit is still to be shown.
    if let (Some(child), Some(program)) = (&child, args.command.first()) {
        writeln!(out, "+ {:>7} {program}", child.id())?;
        shown.insert(child.id());
    }
    let mut members = tracker.members(tree)?;
    members.retain(|member| !shown.contains(&member.pid));
    leash::kernel::fill_comms(&mut members);
    for member in members {
        writeln!(
            out,
            "+ {:>7} {}",
            member.pid,
            member.comm.unwrap_or_default()
        )?;
        shown.insert(member.pid);
    }
    let mut root_status = None;
    loop {
        // Read before the events: every exit the counters count has its event queued already.
        let status = tracker.tree_status(tree)?;
        for event in tracker.drain_events() {
            if event.tree != tree {
                continue;
            }
            let show = match event.kind {
                EventKind::Fork => shown.insert(event.pid),
                EventKind::Exit | EventKind::RootExit => {
                    // Its pid may come back as a new member.
                    shown.remove(&event.pid);
                    true
                }
                EventKind::ForkKilled
                | EventKind::ForkFailed
                | EventKind::Exec
                | EventKind::Diagnostic => true,
                // A host's, not a tree's (this tracker watches none).
                EventKind::HostDying => false,
            };
            if show {
                print_event(&mut out, &event)?;
            }
        }
        // Reap our own child so it does not linger as a zombie member.
        if let Some(c) = child.as_mut()
            && let Some(status) = c.try_wait().context("waiting for CMD")?
        {
            root_status = Some(status);
            child = None;
        }
        if status.members == 0 {
            summarize(&mut out, &status)?;
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(root_status.map_or(ExitCode::SUCCESS, super::exit_code))
}

fn print_event(out: &mut impl Write, event: &TreeEvent) -> io::Result<()> {
    let comm = leash::proc::process(event.pid)
        .map(|p| p.comm)
        .unwrap_or_default();
    let pid = event.pid;
    match event.kind {
        EventKind::Fork => writeln!(out, "+ {pid:>7} {comm} (forked by {})", event.parent),
        EventKind::Exec => writeln!(out, ">  {pid:>6} runs {}", event.comm),
        EventKind::Exit => writeln!(out, "- {pid:>7} {} exited", event.comm),
        EventKind::RootExit => writeln!(out, "- {pid:>7} {} exited (the root)", event.comm),
        EventKind::ForkKilled => writeln!(out, "! {pid:>7} killed as it forked"),
        EventKind::ForkFailed => writeln!(
            out,
            "! {pid:>7} forked by {} could not be tracked (the map is full)",
            event.parent
        ),
        EventKind::Diagnostic => writeln!(
            out,
            "! {pid:>7} {}: the programs report {:?}",
            event.comm,
            leash_common::Diagnostic::from_u32(event.parent)
        ),
        EventKind::HostDying => writeln!(out, "! {pid:>7} host is dying"),
    }
}

fn summarize(out: &mut impl Write, status: &TreeStatus) -> io::Result<()> {
    writeln!(
        out,
        "tree {} is empty: {} registered, {} joined at fork, {} left, {} could not be tracked",
        status.tree, status.seeded, status.joined, status.left, status.failed_inserts
    )
}
