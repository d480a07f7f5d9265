//! Reading a guest's console: init's markers and libtest's own lines, into what each scenario did
//! on one kernel.

use std::time::{Duration, Instant};

use super::guest::MARKER;
use crate::count_before;

/// One scenario's run in a guest: the test binary, with that scenario's tests.
#[derive(Default)]
pub(super) struct ScenarioRun {
    pub name: String,
    /// Its exit status, once init reported it.
    pub status: Option<i32>,
    /// From libtest's `test result:` line.
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    pub had_result: bool,
    /// Tests libtest reported `FAILED`, by full name (`threads::fifty_threads_are_one_member`).
    pub failures: Vec<String>,
    pub took: Duration,
    started: Option<Instant>,
}

impl ScenarioRun {
    /// Whether the run ended well and no test in it failed.
    pub(super) fn ok(&self) -> bool {
        self.status == Some(0) && self.failed == 0
    }

    /// What went wrong, for the list of failures: failed tests by name, or how the run ended
    /// when libtest could not say.
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = self.failures.clone();
        if problems.is_empty() && !self.ok() {
            problems.push(match self.status {
                None => format!("{} (did not finish)", self.name),
                // timeout -s KILL: 128 + 9.
                Some(137) => format!("{} (killed after its timeout)", self.name),
                Some(status) if !self.had_result => {
                    format!("{} (exit status {status}, no test result)", self.name)
                }
                Some(status) => format!("{} (exit status {status})", self.name),
            });
        }
        problems
    }
}

/// What the console of one kernel's run said so far.
#[derive(Default)]
pub(super) struct Console {
    /// As init printed it (`uname -r`), once it did.
    pub release: Option<String>,
    pub scenarios: Vec<ScenarioRun>,
    /// Init reported it was done.
    pub done: bool,
    /// Set up and ran: everything after init's first marker is the tests' output.
    pub started: bool,
    /// The kernel oopsed on an int3 (`int3: 0000 [#1]`): a CPU ran a breakpoint the kernel
    /// had put in its own code while patching it (a static key, a BPF trampoline's entry) and
    /// had taken out again. Multi-threaded emulation (TCG) now and then lets another vCPU run
    /// the patched instruction as it stood earlier; hardware and KVM do not.
    pub patch_oops: bool,
}

impl Console {
    /// Takes one line of the console into account.
    pub(super) fn read(&mut self, line: &str) {
        let now = Instant::now();
        if let Some(marker) = line.strip_prefix(MARKER) {
            let mut words = marker.split_whitespace();
            match (words.next(), words.next(), words.next()) {
                (Some("kernel"), Some(release), _) => {
                    self.release = Some(release.to_owned());
                    self.started = true;
                }
                (Some("begin"), Some(name), _) => self.scenarios.push(ScenarioRun {
                    name: name.to_owned(),
                    started: Some(now),
                    ..ScenarioRun::default()
                }),
                (Some("end"), Some(name), Some(status)) => {
                    if let Some(run) = self.scenarios.last_mut().filter(|run| run.name == name) {
                        run.status = status.parse().ok();
                        run.took = run.started.map_or(Duration::ZERO, |s| now - s);
                    }
                }
                (Some("done"), _, _) => self.done = true,
                _ => {}
            }
            return;
        }
        if line.contains("int3: 0000 [#") {
            self.patch_oops = true;
        }
        let Some(run) = self.scenarios.last_mut().filter(|run| run.status.is_none()) else {
            return;
        };
        if let Some(result) = line.strip_prefix("test result: ") {
            run.passed += count_before(result, " passed");
            run.failed += count_before(result, " failed");
            run.ignored += count_before(result, " ignored");
            run.had_result = true;
        } else if let Some(test) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            run.failures.push(test.to_owned());
        }
    }

    /// The scenario still running when the console stopped, if any.
    pub(super) fn unfinished(&self) -> Option<&ScenarioRun> {
        self.scenarios.last().filter(|run| run.status.is_none())
    }

    /// Makes ready for the next boot of the same kernel: what it says of its end is its own.
    pub(super) fn reboot(&mut self) {
        self.done = false;
        self.patch_oops = false;
    }

    /// Forgets the scenario that did not finish, to run it again: returns its name.
    pub(super) fn forget_unfinished(&mut self) -> Option<String> {
        match self.unfinished() {
            Some(_) => self.scenarios.pop().map(|run| run.name),
            None => None,
        }
    }

    /// Whether scenario `name` ran to its end.
    pub(super) fn finished(&self, name: &str) -> bool {
        self.scenarios
            .iter()
            .any(|run| run.name == name && run.status.is_some())
    }

    /// The scenarios that failed, by name.
    pub(super) fn failed(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .filter(|run| !run.ok())
            .map(|run| run.name.clone())
            .collect()
    }

    /// Takes the runs of the scenarios `names` out, to run them again.
    pub(super) fn take(&mut self, names: &[String]) -> Vec<ScenarioRun> {
        let (taken, kept) = std::mem::take(&mut self.scenarios)
            .into_iter()
            .partition(|run| names.contains(&run.name));
        self.scenarios = kept;
        taken
    }

    pub(super) fn totals(&self) -> (u64, u64, u64) {
        self.scenarios.iter().fold((0, 0, 0), |(p, f, i), run| {
            // A run that failed without a libtest failure (a crash, a timeout) counts as one
            // failed test, so that no failure totals to zero.
            let failed = if run.ok() {
                run.failed
            } else {
                run.failed.max(1)
            };
            (p + run.passed, f + failed, i + run.ignored)
        })
    }

    pub(super) fn problems(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .flat_map(ScenarioRun::problems)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &[&str]) -> Console {
        let mut console = Console::default();
        for line in lines {
            console.read(line);
        }
        console
    }

    #[test]
    fn markers_and_libtest_lines_make_each_scenarios_result() {
        let console = read(&[
            "SeaBIOS (version 1.16.2)",
            "@@vmtest kernel 5.10.0-46-cloud-amd64",
            "@@vmtest begin fork_chain",
            "running 1 test",
            "test fork_chain::a_fork_chain_is_tracked_hop_by_hop ... ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 2.01s",
            "@@vmtest end fork_chain 0",
            "@@vmtest begin threads",
            "test threads::fifty_threads_are_one_member ... FAILED",
            "test threads::a_fork_from_a_thread_is_a_member ... ok",
            "test result: FAILED. 1 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out",
            "@@vmtest end threads 101",
            "@@vmtest begin daemon_restart",
            "@@vmtest end daemon_restart 137",
            "@@vmtest begin pinned_tracker",
        ]);
        assert_eq!(console.release.as_deref(), Some("5.10.0-46-cloud-amd64"));
        assert!(console.started && !console.done);
        assert_eq!(console.scenarios.len(), 4);
        assert!(console.scenarios[0].ok());
        assert_eq!(console.totals(), (2, 3, 2));
        assert_eq!(
            console.problems(),
            [
                "threads::fifty_threads_are_one_member",
                "daemon_restart (killed after its timeout)",
                "pinned_tracker (did not finish)",
            ]
        );
        assert_eq!(console.unfinished().unwrap().name, "pinned_tracker");
    }

    #[test]
    fn a_guest_booted_again_after_an_int3_oops_goes_on_with_the_scenario_it_stopped_in() {
        let mut console = read(&[
            "@@vmtest kernel 7.3-cloud-amd64",
            "@@vmtest begin fork_chain",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@vmtest end fork_chain 0",
            "@@vmtest begin daemon_restart",
            "test daemon_restart::a_hand_over_kills_nothing_and_the_next_daemon_enforces ... ok",
            "[  152.302292] Oops: int3: 0000 [#1] SMP NOPTI",
            "[  152.311287] RIP: 0010:security_ptrace_access_check+0x5/0x100",
        ]);
        assert!(console.patch_oops && !console.done);
        assert_eq!(
            console.forget_unfinished().as_deref(),
            Some("daemon_restart")
        );
        assert!(console.finished("fork_chain") && !console.finished("daemon_restart"));
        console.reboot();
        assert!(!console.patch_oops);
        for line in [
            "@@vmtest kernel 7.3-cloud-amd64",
            "@@vmtest begin daemon_restart",
            "test result: ok. 9 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@vmtest end daemon_restart 0",
            "@@vmtest done",
        ] {
            console.read(line);
        }
        assert!(console.done);
        assert_eq!(console.totals(), (10, 0, 0));
        assert!(console.problems().is_empty());
        // Oopses of other kinds are not this one.
        assert!(!read(&["BUG: kernel NULL pointer dereference, address: 0"]).patch_oops);
        // Before 5.16 the kernel did not say "Oops:" first.
        assert!(read(&["[   12.5] int3: 0000 [#1] SMP NOPTI"]).patch_oops);
    }

    #[test]
    fn a_failed_scenario_taken_out_to_run_again_counts_as_its_second_run_did() {
        let mut console = read(&[
            "@@vmtest kernel 7.3-cloud-amd64",
            "@@vmtest begin kill_threads",
            "test kill_threads::the_kill_reports_when_every_thread_has_exited ... FAILED",
            "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@vmtest end kill_threads 101",
            "@@vmtest begin threads",
            "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@vmtest end threads 0",
            "@@vmtest done",
        ]);
        assert_eq!(console.failed(), ["kill_threads"]);
        let first = console.take(&console.failed());
        assert_eq!(first.len(), 1);
        assert!(!first[0].ok());
        console.reboot();
        assert!(!console.done);
        for line in [
            "@@vmtest kernel 7.3-cloud-amd64",
            "@@vmtest begin kill_threads",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
            "@@vmtest end kill_threads 0",
            "@@vmtest done",
        ] {
            console.read(line);
        }
        assert!(console.failed().is_empty());
        assert_eq!(console.totals(), (3, 0, 0));
    }
}
