//! How often the kernel skipped each attached program: its `recursion_misses`.
//!
//! The kernel keeps a tracepoint program from running twice at once on a CPU (Linux 6.1), and
//! skips it, counted, when it would. Up to 6.18 the programs run with preemption off, so only
//! true recursion trips that guard, which the programs here never do. Kernels that run them
//! preemptibly (7.x with CONFIG_PREEMPT_LAZY) skip a program for every task on a CPU where a
//! preempted task is inside it: a fork or an exit goes unseen (see `program::FORK_AGAIN`).
//!
//! What the kill makes of it: while some exit program has never been skipped, every process
//! that exited was taken out of the member map, so an entry still there names its process, and
//! a pidfd opened before the entry was read again names it too. Once both have been skipped,
//! an entry may outlive its process, its pid free for another, and each member must be checked
//! against /proc before it is signalled.

use std::{
    os::fd::{AsFd, OwnedFd},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context, Result};
use leash_common::program;

use super::{attach::counts_skips, pins::Pins, programs::Layer};
use crate::sys;

/// The attached programs, to read their counts from: by id, opened at each read (the daemon's
/// descriptors are counted against its limit, and a scrape can afford the calls), but for the
/// exit programs, whose counts every signal of a kill reads.
#[derive(Debug)]
pub struct ProgramSkips {
    programs: Vec<(&'static str, u32)>,
    /// The exit programs' descriptors.
    exits: Vec<OwnedFd>,
    /// Both exit programs have been skipped at least once: the count only grows.
    exits_missed: AtomicBool,
}

impl ProgramSkips {
    /// Of the programs a previous daemon pinned the links of, of the layers whose skips are
    /// counted. Best effort but for the tracking layer: a program whose id cannot be had is
    /// left out, and the log says why.
    pub(super) fn of_pinned(pins: &Pins) -> Result<Self> {
        let mut programs = Vec::new();
        for program in pins.pinned_programs() {
            if !counts_skips(program.layer) {
                continue;
            }
            let id = pins
                .open_link(program.name)
                .and_then(|link| Ok(link.info()?.program_id()));
            match id {
                Ok(id) => programs.push((program.name, id)),
                Err(e) if program.layer == Layer::Tracking => return Err(e),
                Err(e) => {
                    tracing::debug!(program = program.name, "its skips are not counted: {e:#}")
                }
            }
        }
        Self::new(programs)
    }

    /// Of the programs named, with their ids.
    pub(super) fn new(programs: Vec<(&'static str, u32)>) -> Result<Self> {
        let exits = programs
            .iter()
            .filter(|(name, _)| *name == program::EXIT || *name == program::EXIT_AGAIN)
            .map(|&(name, id)| {
                sys::bpf_prog_fd_by_id(id).with_context(|| format!("opening program {name}"))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            programs,
            exits,
            exits_missed: AtomicBool::new(false),
        })
    }

    /// Each program's count now (a program whose count cannot be read is left out).
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        self.programs
            .iter()
            .filter_map(|&(name, id)| {
                let program = sys::bpf_prog_fd_by_id(id).ok()?;
                let misses = sys::bpf_prog_recursion_misses(program.as_fd()).ok()?;
                Some((name, misses))
            })
            .collect()
    }

    /// How often the kernel skipped the fork programs, both together, so far (a count that can
    /// not be read counts 0).
    pub fn fork_misses(&self) -> u64 {
        self.programs
            .iter()
            .filter(|(name, _)| *name == program::FORK || *name == program::FORK_AGAIN)
            .filter_map(|&(_, id)| {
                let program = sys::bpf_prog_fd_by_id(id).ok()?;
                sys::bpf_prog_recursion_misses(program.as_fd()).ok()
            })
            .sum()
    }

    /// Whether the kernel has run some exit program for every exit so far: then a member
    /// entry read before this call names its process, or one yet to be taken out. False once
    /// both exit programs have been skipped, for good; false too while their counts cannot be
    /// read.
    pub fn every_exit_seen(&self) -> bool {
        if self.exits_missed.load(Ordering::Relaxed) {
            return false;
        }
        let mut missed = 0;
        for program in &self.exits {
            match sys::bpf_prog_recursion_misses(program.as_fd()) {
                Ok(0) => return true,
                Ok(_) => missed += 1,
                Err(_) => return false,
            }
        }
        if missed > 0 && !self.exits_missed.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the kernel skipped both exit programs for some exit (it runs tracepoint \
                 programs preemptibly, as 7.x does with CONFIG_PREEMPT_LAZY): from now on, \
                 kills check each member against /proc before signalling it, and take out \
                 the entries whose processes are gone. leash_program_skips_total counts the \
                 skips"
            );
        }
        false
    }
}
