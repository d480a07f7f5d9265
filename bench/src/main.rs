//! `cargo xtask bench [--quick]`: leash measured side by side, in one run, with what people use
//! today (no leash at all, a /proc walk, killpg, and the kernel's own cgroup.kill), and written
//! to BENCHMARKS.md. Every figure is a median over repeated runs; every ratio comes from runs of
//! the same repetition, the variants alternating. Needs root.

mod measure;
mod sections;
mod trees;

use std::{fs, path::PathBuf, process::ExitCode};

use anyhow::{Context, Result};
use clap::Parser;

/// Runs every benchmark and writes the report.
#[derive(Parser, Debug)]
struct Args {
    /// A shorter run (under 2 minutes): fewer repetitions and smaller sizes.
    #[arg(long)]
    quick: bool,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
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
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
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
    let forker = trees::build_forker()?;
    let mut report = measure::Report::new(&plan);
    sections::overhead(&plan, &mut report)?;
    sections::kill_latency(&plan, &mut report)?;
    sections::escapes(&plan, &mut report)?;
    sections::detection(&plan, &mut report)?;
    sections::scale(&plan, &forker, &mut report)?;
    report.finish(started.elapsed());
    fs::write(&args.out, report.text())
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!("wrote {} in {:.0?}", args.out.display(), started.elapsed());
    Ok(())
}
