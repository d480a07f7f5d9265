//! `cargo xtask bench [--quick]`: leash measured side by side, in one run, with what people use
//! today (no leash at all, a /proc walk, killpg, and the kernel's own cgroup.kill), and written
//! to BENCHMARKS.md. Every figure is a median over repeated runs; every ratio comes from runs of
//! the same repetition, the variants alternating. Needs root.

mod detection;
mod flood;
mod kill_beside;
mod load;
mod measure;
mod sections;
mod trees;

use std::{fs, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// Runs every benchmark and writes the report.
#[derive(Parser, Debug)]
struct Args {
    /// A shorter run (a few minutes): fewer repetitions and smaller sizes.
    #[arg(long)]
    quick: bool,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Run only these sections (a partial report: for working on one section).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    Overhead,
    Kill,
    Escapes,
    Detection,
    Scale,
    Load,
}

/// What the benchmark runs of itself as another process.
#[derive(Subcommand, Debug)]
enum Role {
    /// The flooding client of the hostile-load section, run as an unprivileged uid.
    #[command(hide = true)]
    Flood(flood::FloodArgs),
}

/// Sizes and repetitions of one run.
pub struct Plan {
    pub quick: bool,
    pub overhead_reps: usize,
    pub overhead_loops: usize,
    pub kill_reps: usize,
    pub kill_sizes: &'static [usize],
    pub escape_trials: usize,
    pub detection_trials: usize,
    pub scale: usize,
    /// Hostile load: kills timed with the daemon idle.
    pub load_idle_trials: usize,
    /// Hostile load: kills timed under each flood, as many as fit in `load_budget`.
    pub load_trials: usize,
    pub load_budget: Duration,
    /// Hostile load: the longest a kill is waited for (one past it is recorded at the cap).
    pub load_cap: Duration,
    /// Hostile load: the longest a new host's tree is waited for under a flood, and the
    /// daemon's answer after it.
    pub load_wait: Duration,
    /// Hostile load: adoptions of a tree of `scale` processes, kills timed during each.
    pub load_adoptions: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                overhead_reps: 3,
                overhead_loops: 1000,
                kill_reps: 3,
                kill_sizes: &[10, 100, 1000],
                escape_trials: 5,
                detection_trials: 7,
                scale: 10_000,
                load_idle_trials: 7,
                load_trials: 3,
                load_budget: Duration::from_secs(5),
                load_cap: Duration::from_secs(5),
                load_wait: Duration::from_secs(2),
                load_adoptions: 2,
            }
        } else {
            Self {
                quick,
                overhead_reps: 7,
                overhead_loops: 3000,
                kill_reps: 5,
                kill_sizes: &[10, 100, 1000, 5000],
                escape_trials: 20,
                detection_trials: 21,
                scale: 100_000,
                load_idle_trials: 15,
                load_trials: 7,
                load_budget: Duration::from_secs(15),
                load_cap: Duration::from_secs(15),
                load_wait: Duration::from_secs(5),
                load_adoptions: 2,
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.role {
        Some(Role::Flood(flood)) => flood::run(flood),
        None => run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leash-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    let plan = Plan::new(args.quick);
    let started = std::time::Instant::now();
    // Compiled when a section first needs it: the overhead section does not, and runs where
    // there is no C compiler (the arm64 guest of `cargo xtask bench --arch arm64`).
    let forker = trees::Forker::default();
    let mut report = measure::Report::new(&plan);
    let runs = |section| args.only.is_empty() || args.only.contains(&section);
    // A section that fails costs only itself: the others still run, and the report says
    // which failed and why (a full run takes most of an hour).
    let mut failed = Vec::new();
    let mut section =
        |section: Section, run: &mut dyn FnMut(&mut measure::Report) -> Result<()>| {
            if !runs(section) {
                return;
            }
            if let Err(e) = run(&mut report) {
                eprintln!("leash-bench: the {section:?} section failed: {e:#}");
                report.line(&format!("**The {section:?} section failed:** {e:#}"));
                failed.push(section);
            }
        };
    section(Section::Overhead, &mut |report| {
        sections::overhead(&plan, report)
    });
    section(Section::Kill, &mut |report| {
        sections::kill_latency(&plan, report)?;
        kill_beside::kill_beside_others(&plan, forker.path()?, report)
    });
    section(Section::Escapes, &mut |report| {
        sections::escapes(&plan, report)
    });
    section(Section::Detection, &mut |report| {
        detection::detection(&plan, report)
    });
    section(Section::Scale, &mut |report| {
        sections::scale(&plan, forker.path()?, report)
    });
    section(Section::Load, &mut |report| {
        load::hostile_load(&plan, forker.path()?, report)
    });
    report.finish(started.elapsed());
    fs::write(&args.out, report.text())
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {} in {:.0?}", args.out.display(), started.elapsed());
    if !failed.is_empty() {
        anyhow::bail!("sections failed: {failed:?} (the report says why)");
    }
    Ok(())
}
