//! The kill's steps against a fake kernel: a member map, processes that die when signalled
//! (or not), forks that the doomed flag turns into the forker's death, and a clock that moves
//! only when the test moves it. No BPF, no real process.

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, BTreeSet},
    io,
    rc::Rc,
    time::{Duration, Instant},
};

use anyhow::Result;
use leash_common::{Member, Pid, TreeId};

use super::{
    BURST_SIGNALS, FIRST_WALK_AFTER, FULL_ROUND_EVERY, KILL_ROUNDS_TIMEOUT, Kill, KillError,
    KillReport, KillStep, KillTarget, SIGNALS_PER_STEP, types::found_all,
};
use crate::{
    kernel::TreeStatus,
    proc::{self, ProcessRef},
};

const TREE: TreeId = 1;
const OTHER_TREE: TreeId = 2;
/// The fake's boot time when a test starts, in ns.
const BOOT_NS: u64 = 1_000_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Running,
    /// Signalled to death: gone at the next tick of the clock.
    Dying,
    /// Out of the map, still releasing what it holds (see `Process::lingers`).
    Exiting,
    /// A zombie: it has finished exiting, not yet reaped.
    Exited,
    Reaped,
}

#[derive(Debug)]
struct Process {
    pid: Pid,
    start_ns: u64,
    state: State,
    /// Handles SIGTERM (cleans up, stays) instead of dying of it.
    ignores_term: bool,
    /// Stuck in the kernel: not even SIGKILL ends it.
    unkillable: bool,
    /// Its exit, once the exit program has run, takes until the test ends it.
    lingers: bool,
    /// The kernel skips the exit programs at its exit: its entry stays in the map.
    exit_unseen: bool,
    /// Every signal sent to it, in order.
    signals: Vec<i32>,
}

/// A handle on one process, as a pidfd is: its pid and start time.
#[derive(Clone, Copy, Debug)]
struct Handle {
    pid: Pid,
    start_ns: u64,
}

/// The fake kernel.
struct Fake {
    epoch: Instant,
    /// How far the clock moved since `epoch`.
    elapsed: Duration,
    members: BTreeMap<Pid, Member>,
    /// Each tree's pids as user space has heard: forks and registrations go in at once (their
    /// records read in time), exits stay until a kill finds them gone (their records unread).
    index: BTreeMap<TreeId, BTreeSet<Pid>>,
    /// Every process ever, the newest of a pid last (processes are behind a RefCell: signals
    /// go through `&self`, as they do through a pidfd).
    processes: RefCell<Vec<Process>>,
    doomed_ns: Option<u64>,
    joined: u64,
    next_pid: Pid,
    /// Walks of the whole member map.
    walks: Cell<usize>,
    /// Lookups of one entry of the member map.
    lookups: Cell<usize>,
    /// Checks whether a process has finished exiting.
    exit_checks: Cell<usize>,
    /// Reads of a process's start time from /proc.
    proc_reads: Cell<usize>,
    /// The exit programs were skipped for some exit (see [`KillTarget::every_exit_seen`]).
    exit_skipped: bool,
    /// Bursts held now (see [`KillTarget::burst`]).
    bursts: Rc<Cell<usize>>,
    /// Whether the marks are in place (see [`KillTarget::marked_in`]).
    marks: bool,
    /// The marked processes (pid and start time) and the tree of their mark.
    marked: BTreeMap<(Pid, u64), TreeId>,
    /// Runs of the reconciling iterator.
    reconciles: usize,
}

/// A burst held on the fake: counted while it lives.
struct Burst(Rc<Cell<usize>>);

impl Drop for Burst {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl Fake {
    fn new() -> Self {
        Self {
            epoch: Instant::now(),
            elapsed: Duration::ZERO,
            members: BTreeMap::new(),
            index: BTreeMap::new(),
            processes: RefCell::new(Vec::new()),
            doomed_ns: None,
            joined: 0,
            next_pid: 1000,
            walks: Cell::new(0),
            lookups: Cell::new(0),
            exit_checks: Cell::new(0),
            proc_reads: Cell::new(0),
            exit_skipped: false,
            bursts: Rc::new(Cell::new(0)),
            marks: false,
            marked: BTreeMap::new(),
            reconciles: 0,
        }
    }

    /// The marks in place, and every member there is now marked in its tree.
    fn with_marks(mut self) -> Self {
        self.marks = true;
        for (&pid, member) in &self.members {
            self.marked.insert((pid, member.start_ns), member.tree);
        }
        self
    }

    /// A marked child in `tree` whose fork the fork programs missed: not in the map until a
    /// reconciling pass puts it there. Returns its pid.
    fn fork_unseen(&mut self, tree: TreeId) -> Pid {
        let child = self.next_pid;
        self.next_pid += 1;
        let start_ns = self.start(child);
        self.marked.insert((child, start_ns), tree);
        child
    }

    /// Boot-time ns now; never a whole number of clock ticks, as a start time the fork program
    /// takes from the kernel almost never is.
    fn boot_ns(&self) -> u64 {
        BOOT_NS + self.elapsed.as_nanos() as u64 + 7
    }

    /// A new running process by `pid`, started now (and the clock moved on a little, so that
    /// whatever comes next, a doom above all, comes later).
    fn start(&mut self, pid: Pid) -> u64 {
        let start_ns = self.boot_ns();
        self.elapsed += Duration::from_micros(1);
        self.processes.get_mut().push(Process {
            pid,
            start_ns,
            state: State::Running,
            ignores_term: false,
            unkillable: false,
            lingers: false,
            exit_unseen: false,
            signals: Vec::new(),
        });
        start_ns
    }

    /// A member of `tree` that joined at a fork, before any kill; its fork record was read.
    fn add_member(&mut self, tree: TreeId) -> Pid {
        let pid = self.add_unindexed_member(tree);
        self.index.entry(tree).or_default().insert(pid);
        pid
    }

    /// A member of `tree` that joined at a fork whose record was dropped, or not read yet.
    fn add_unindexed_member(&mut self, tree: TreeId) -> Pid {
        let pid = self.next_pid;
        self.next_pid += 1;
        let start_ns = self.start(pid);
        self.members.insert(
            pid,
            Member {
                tree,
                parent: 1,
                start_ns,
            },
        );
        self.joined += u64::from(tree == TREE);
        pid
    }

    fn process(&mut self, pid: Pid) -> &mut Process {
        self.processes
            .get_mut()
            .iter_mut()
            .rev()
            .find(|p| p.pid == pid)
            .expect("a process by that pid")
    }

    /// `pid` forks: in a doomed tree the fork program kills the forker, and the child joins
    /// all the same (born doomed). Its record is read at once. Returns the child's pid.
    fn fork(&mut self, pid: Pid) -> Pid {
        let child = self.fork_unrecorded(pid);
        let tree = self.members[&child].tree;
        self.index.entry(tree).or_default().insert(child);
        child
    }

    /// [`Fake::fork`], its record not read (yet).
    fn fork_unrecorded(&mut self, pid: Pid) -> Pid {
        let tree = self.members[&pid].tree;
        let child = self.add_unindexed_member(tree);
        self.members.get_mut(&child).unwrap().parent = pid;
        if self.doomed_ns.is_some() {
            self.process(pid).state = State::Dying;
        }
        child
    }

    /// Moves the clock on: whatever was signalled to death has exited by then, and the exit
    /// program took its entry out.
    fn tick(&mut self, by: Duration) {
        self.elapsed += by.max(Duration::from_micros(100));
        for process in self.processes.get_mut() {
            if process.state == State::Dying {
                process.state = if process.lingers {
                    State::Exiting
                } else {
                    State::Exited
                };
                self.exit_skipped |= process.exit_unseen;
                if !process.exit_unseen
                    && self
                        .members
                        .get(&process.pid)
                        .is_some_and(|m| m.start_ns == process.start_ns)
                {
                    self.members.remove(&process.pid);
                }
            }
        }
    }

    /// Every process still exiting has finished.
    fn finish_exits(&mut self) {
        for process in self.processes.get_mut() {
            if process.state == State::Exiting {
                process.state = State::Exited;
            }
        }
    }

    /// The signals process `pid` (the newest by that pid) was sent.
    fn signals(&mut self, pid: Pid) -> Vec<i32> {
        self.process(pid).signals.clone()
    }

    fn tree_members(&self, tree: TreeId) -> usize {
        self.members.values().filter(|m| m.tree == tree).count()
    }

    /// The member entry of `pid`, looked up as the index's lookups are.
    fn member(&self, pid: Pid) -> Option<Member> {
        self.lookups.set(self.lookups.get() + 1);
        self.members.get(&pid).copied()
    }

    fn indexed(&self, tree: TreeId) -> Vec<Pid> {
        self.index
            .get(&tree)
            .map(|pids| pids.iter().copied().collect())
            .unwrap_or_default()
    }
}

impl KillTarget for Fake {
    type Process = Handle;
    type Burst = Burst;

    fn now(&self) -> Instant {
        self.epoch + self.elapsed
    }

    fn doom(&mut self, tree: TreeId) -> Result<u64> {
        assert_eq!(tree, TREE);
        Ok(*self.doomed_ns.get_or_insert(self.boot_ns()))
    }

    fn tree_status(&self, tree: TreeId) -> Result<TreeStatus> {
        Ok(TreeStatus {
            tree,
            root: 0,
            members: self.tree_members(tree) as u64,
            seeded: 0,
            joined: self.joined,
            left: 0,
            failed_inserts: 0,
            over_quota: 0,
            root_exit_ns: None,
            doomed_ns: self.doomed_ns,
            parent: None,
        })
    }

    fn counted_empty(&self, tree: TreeId) -> Result<bool> {
        Ok(self.tree_members(tree) == 0)
    }

    fn member_entries(&self) -> Result<Vec<(Pid, Member)>> {
        self.walks.set(self.walks.get() + 1);
        Ok(self.members.iter().map(|(&pid, &m)| (pid, m)).collect())
    }

    fn indexed_members(&mut self, tree: TreeId) -> Vec<(Pid, Member)> {
        let mut found = Vec::new();
        for pid in self.indexed(tree) {
            match self.member(pid) {
                Some(member) if member.tree == tree => found.push((pid, member)),
                _ => {
                    self.index.get_mut(&tree).map(|pids| pids.remove(&pid));
                }
            }
        }
        found
    }

    fn reindex(&mut self, tree: TreeId, members: &[(Pid, Member)]) {
        self.index
            .insert(tree, members.iter().map(|&(pid, _)| pid).collect());
    }

    fn drop_stale(&mut self, pid: Pid, stale: Member) -> Result<()> {
        if self.members.get(&pid) == Some(&stale) {
            self.members.remove(&pid);
        }
        Ok(())
    }

    fn open(&self, pid: Pid) -> io::Result<Handle> {
        let processes = self.processes.borrow();
        match processes.iter().rev().find(|p| p.pid == pid) {
            Some(p) if p.state != State::Reaped => Ok(Handle {
                pid,
                start_ns: p.start_ns,
            }),
            _ => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }

    fn member(&self, pid: Pid) -> Option<Member> {
        Fake::member(self, pid)
    }

    fn kernel_kill(&mut self, _tree: TreeId, _signal: i32) -> Result<Option<u32>> {
        Ok(None)
    }

    fn reconcile(&mut self) -> Result<()> {
        if !self.marks {
            return Ok(());
        }
        self.reconciles += 1;
        let running: Vec<(Pid, u64, TreeId)> = self
            .processes
            .get_mut()
            .iter()
            .filter(|p| p.state == State::Running)
            .filter_map(|p| Some((p.pid, p.start_ns, *self.marked.get(&(p.pid, p.start_ns))?)))
            .collect();
        for (pid, start_ns, tree) in running {
            if self.members.contains_key(&pid) {
                continue;
            }
            let member = Member {
                tree,
                parent: 1,
                start_ns,
            };
            self.members.insert(pid, member);
            self.joined += u64::from(tree == TREE);
        }
        Ok(())
    }

    fn marked_in(&self, handle: &Handle, tree: TreeId) -> Option<bool> {
        if !self.marks {
            return None;
        }
        let mark = self.marked.get(&(handle.pid, handle.start_ns))?;
        Some(*mark == tree)
    }

    fn every_exit_seen(&self) -> bool {
        !self.exit_skipped
    }

    fn start_ticks(&self, pid: Pid) -> io::Result<Option<u64>> {
        self.proc_reads.set(self.proc_reads.get() + 1);
        let processes = self.processes.borrow();
        Ok(processes
            .iter()
            .rev()
            .find(|p| p.pid == pid && p.state != State::Reaped)
            .map(|p| proc::ns_to_ticks(p.start_ns)))
    }

    fn send_signal(&self, handle: &Handle, signal: i32) -> io::Result<()> {
        let mut processes = self.processes.borrow_mut();
        let process = processes
            .iter_mut()
            .find(|p| p.pid == handle.pid && p.start_ns == handle.start_ns)
            .filter(|p| p.state != State::Reaped)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
        process.signals.push(signal);
        let dies = match signal {
            libc::SIGKILL => !process.unkillable,
            libc::SIGTERM => !process.ignores_term,
            _ => false,
        };
        if dies && process.state == State::Running {
            process.state = State::Dying;
        }
        Ok(())
    }

    fn burst(&self) -> Burst {
        self.bursts.set(self.bursts.get() + 1);
        Burst(self.bursts.clone())
    }

    fn has_exited(&self, process: ProcessRef) -> bool {
        self.exit_checks.set(self.exit_checks.get() + 1);
        let processes = self.processes.borrow();
        processes
            .iter()
            .find(|p| p.pid == process.pid && proc::ns_to_ticks(p.start_ns) == process.start_ticks)
            .is_none_or(|p| matches!(p.state, State::Exited | State::Reaped))
    }
}

/// Steps `kill` until it ends, moving the fake's clock by each wait; `between` runs after
/// every step, before the clock moves (what the world does while the driver sleeps: a member
/// just sent SIGKILL may still be forking).
fn drive(
    kill: &mut Kill,
    fake: &mut Fake,
    mut between: impl FnMut(&mut Fake),
) -> Result<KillReport, KillError> {
    for _ in 0..1_000_000 {
        match kill.step_on(fake)? {
            KillStep::Wait(pause) => {
                between(fake);
                fake.tick(pause);
            }
            KillStep::Done(report) => return Ok(report),
        }
    }
    panic!("the kill never ended");
}

#[test]
fn sigterm_first_then_sigkill_once_the_grace_is_over() {
    let mut fake = Fake::new();
    let (polite, stubborn) = (fake.add_member(TREE), fake.add_member(TREE));
    fake.process(stubborn).ignores_term = true;
    let grace = Duration::from_secs(5);
    let mut kill = Kill::new(TREE, grace);
    let report = drive(&mut kill, &mut fake, |fake| {
        // No SIGKILL while the grace lasts.
        if fake.elapsed < grace {
            assert_eq!(fake.signals(stubborn), [libc::SIGTERM]);
        }
    })
    .unwrap();
    assert!(fake.elapsed >= grace, "the grace was waited out");
    assert_eq!(fake.signals(polite), [libc::SIGTERM], "it left on SIGTERM");
    assert_eq!(fake.signals(stubborn), [libc::SIGTERM, libc::SIGKILL]);
    assert_eq!((report.terminated, report.killed, report.rounds), (2, 1, 1));
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn a_shortened_grace_ends_sooner() {
    let mut fake = Fake::new();
    let stubborn = fake.add_member(TREE);
    fake.process(stubborn).ignores_term = true;
    let mut kill = Kill::new(TREE, Duration::from_secs(60));
    kill.step_on(&mut fake).unwrap();
    kill.shorten_grace(Duration::from_secs(1));
    kill.shorten_grace(Duration::from_secs(30)); // never lengthened again
    drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert!(fake.elapsed >= Duration::from_secs(1) && fake.elapsed < Duration::from_secs(2));
    assert_eq!(fake.signals(stubborn), [libc::SIGTERM, libc::SIGKILL]);
}

#[test]
fn rounds_go_on_until_the_tree_is_empty() {
    let mut fake = Fake::new();
    // More than a step signals: the first round takes several steps.
    let members: Vec<Pid> = (0..SIGNALS_PER_STEP * 2 + 10)
        .map(|_| fake.add_member(TREE))
        .collect();
    let outsider = fake.add_member(OTHER_TREE);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let mut steps = 0;
    let report = drive(&mut kill, &mut fake, |_| steps += 1).unwrap();
    for &pid in &members {
        assert_eq!(fake.signals(pid), [libc::SIGKILL], "one SIGKILL each");
    }
    assert_eq!(report.killed, members.len());
    assert_eq!((report.terminated, report.rounds), (0, 1));
    assert!(steps >= 3, "at most {SIGNALS_PER_STEP} signals a step");
    assert_eq!(fake.tree_members(TREE), 0);
    assert!(
        fake.signals(outsider).is_empty(),
        "another tree is left alone"
    );
    assert_eq!(fake.tree_members(OTHER_TREE), 1);
}

#[test]
fn newborns_between_rounds_are_killed() {
    let mut fake = Fake::new();
    let parent = fake.add_member(TREE);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    // The first round signals the parent; before it dies, it forks (and the fork program
    // kills it for that), and its child forks again in the next gap.
    kill.step_on(&mut fake).unwrap();
    assert_eq!(fake.signals(parent), [libc::SIGKILL]);
    let child = fake.fork(parent);
    let mut grandchild = None;
    let report = drive(&mut kill, &mut fake, |fake| {
        if grandchild.is_none() && fake.signals(child) == [libc::SIGKILL] {
            grandchild = Some(fake.fork(child));
        }
    })
    .unwrap();
    let grandchild = grandchild.expect("the child was signalled");
    assert_eq!(fake.signals(child), [libc::SIGKILL]);
    assert_eq!(fake.signals(grandchild), [libc::SIGKILL]);
    assert_eq!((report.killed, report.rounds), (3, 3));
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn a_newborn_gets_no_grace() {
    let mut fake = Fake::new();
    let parent = fake.add_member(TREE);
    fake.process(parent).ignores_term = true;
    let grace = Duration::from_secs(10);
    let mut kill = Kill::new(TREE, grace);
    kill.step_on(&mut fake).unwrap();
    assert_eq!(fake.signals(parent), [libc::SIGTERM]);
    // It forks in its grace: the fork program kills it, and its child is born doomed.
    let child = fake.fork(parent);
    fake.tick(Duration::from_millis(1));
    let mut killed_at = None;
    let report = drive(&mut kill, &mut fake, |fake| {
        if killed_at.is_none() && !fake.signals(child).is_empty() {
            killed_at = Some(fake.elapsed);
        }
    })
    .unwrap();
    assert_eq!(fake.signals(child), [libc::SIGKILL], "SIGKILL, not SIGTERM");
    assert!(
        killed_at.unwrap() < Duration::from_millis(100),
        "at once, not after the grace"
    );
    assert!(fake.elapsed < grace, "an empty tree ends the grace");
    assert_eq!((report.terminated, report.killed, report.rounds), (1, 1, 0));
}

#[test]
fn a_member_that_never_dies_is_reported_unkillable() {
    let mut fake = Fake::new();
    let stuck = fake.add_member(TREE);
    let gone = fake.add_member(TREE);
    fake.process(stuck).unkillable = true;
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let error = drive(&mut kill, &mut fake, |_| {}).unwrap_err();
    let KillError::Unkillable {
        tree,
        remaining,
        rounds,
    } = error
    else {
        panic!("{error:?}");
    };
    assert_eq!((tree, remaining), (TREE, 1));
    assert!(
        fake.elapsed >= KILL_ROUNDS_TIMEOUT,
        "rounds went on for the whole timeout"
    );
    assert!(fake.elapsed < KILL_ROUNDS_TIMEOUT + FULL_ROUND_EVERY * 2);
    // One full round a second, and nothing more: SIGKILL is sent once.
    let expected = (KILL_ROUNDS_TIMEOUT.as_secs() / FULL_ROUND_EVERY.as_secs()) as u32;
    assert!(
        (expected..=expected + 2).contains(&rounds),
        "{rounds} rounds"
    );
    assert_eq!(fake.signals(stuck), [libc::SIGKILL]);
    assert_eq!(fake.signals(gone), [libc::SIGKILL]);
}

#[test]
fn a_recycled_pid_is_never_signalled() {
    let mut fake = Fake::new();
    // Entries the fork program made, more than one step signals: a round queues them all, and
    // the last ones are signalled a step later.
    let members: Vec<Pid> = (0..SIGNALS_PER_STEP + 10)
        .map(|_| fake.add_member(TREE))
        .collect();
    // One the first step does not reach (SIGKILLs queue in reverse order of the walk).
    let recycled = members[0];
    let mut kill = Kill::new(TREE, Duration::ZERO);
    kill.step_on(&mut fake).unwrap();
    assert!(
        fake.signals(recycled).is_empty(),
        "not signalled in the first step"
    );
    // Between the steps it exits (the exit program takes its entry out), is reaped, and its
    // pid goes to an unrelated process.
    fake.process(recycled).state = State::Reaped;
    fake.members.remove(&recycled);
    fake.tick(Duration::from_millis(20));
    fake.start(recycled);
    drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert!(
        fake.signals(recycled).is_empty(),
        "the new process is left alone"
    );
    assert_eq!(fake.process(recycled).state, State::Running);
    for &pid in &members[1..] {
        assert_eq!(fake.signals(pid), [libc::SIGKILL]);
    }
}

#[test]
fn a_stale_entry_from_proc_is_taken_out_not_signalled() {
    let mut fake = Fake::new();
    let live = fake.add_member(TREE);
    // An entry user space made from /proc (its start a whole number of clock ticks) for a
    // process that is gone, its pid taken by an unrelated process since.
    let pid = 4242;
    let ticks = proc::ns_to_ticks(BOOT_NS) + 1;
    fake.members.insert(
        pid,
        Member {
            tree: TREE,
            parent: 1,
            start_ns: proc::ticks_to_ns(ticks),
        },
    );
    fake.tick(Duration::from_millis(50));
    fake.start(pid);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert!(
        fake.signals(pid).is_empty(),
        "the unrelated process is left alone"
    );
    assert!(fake.member(pid).is_none(), "the stale entry is taken out");
    assert_eq!(fake.signals(live), [libc::SIGKILL]);
    assert_eq!(report.killed, 1);
}

#[test]
fn an_entry_whose_exit_the_kernel_skipped_is_taken_out_at_the_next_walk() {
    let mut fake = Fake::new();
    let (unseen, seen) = (fake.add_member(TREE), fake.add_member(TREE));
    fake.process(unseen).exit_unseen = true;
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(fake.signals(unseen), [libc::SIGKILL], "signalled once");
    assert_eq!(fake.signals(seen), [libc::SIGKILL]);
    assert!(fake.member(unseen).is_none(), "its entry is taken out");
    assert!(
        report.elapsed <= FIRST_WALK_AFTER + Duration::from_millis(50),
        "at the next walk, not after {KILL_ROUNDS_TIMEOUT:?} of rounds: {:?}",
        report.elapsed
    );
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn the_recycled_pid_of_an_entry_left_behind_is_never_signalled() {
    recycled_pid_of_an_entry_left_behind(false);
}

#[test]
fn a_recycled_pid_with_no_mark_is_never_signalled_where_the_marks_are() {
    recycled_pid_of_an_entry_left_behind(true);
}

/// A member the fork program put in (its start exact) died unseen by the exit programs (held by
/// a preempted task): its entry stays, and its pid goes to an unrelated process, which has no
/// mark where `marks` puts them in place. It is left alone, and the entry taken out.
fn recycled_pid_of_an_entry_left_behind(marks: bool) {
    let mut fake = Fake::new();
    let live = fake.add_member(TREE);
    let left = fake.add_member(TREE);
    if marks {
        fake = fake.with_marks();
    }
    fake.process(left).state = State::Reaped;
    fake.exit_skipped = true;
    fake.tick(Duration::from_millis(20));
    fake.start(left);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert!(
        fake.signals(left).is_empty(),
        "the unrelated process is left alone"
    );
    assert_eq!(fake.process(left).state, State::Running);
    assert!(fake.member(left).is_none(), "the entry is taken out");
    assert_eq!(fake.signals(live), [libc::SIGKILL]);
    assert_eq!(report.killed, 1);
}

#[test]
fn while_the_exit_programs_have_missed_no_exit_no_member_is_read_from_proc() {
    let mut fake = Fake::new();
    let members: Vec<Pid> = (0..10).map(|_| fake.add_member(TREE)).collect();
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(report.killed, members.len());
    assert_eq!(fake.proc_reads.get(), 0, "the entries are proof enough");
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn a_fork_the_programs_missed_is_found_by_its_mark_and_killed() {
    let mut fake = Fake::new();
    let member = fake.add_member(TREE);
    let mut fake = fake.with_marks();
    let unseen = fake.fork_unseen(TREE);
    let grandchild = fake.fork_unseen(TREE);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    drive(&mut kill, &mut fake, |_| {}).unwrap();
    for pid in [member, unseen, grandchild] {
        assert_eq!(fake.signals(pid), [libc::SIGKILL], "{pid} killed");
    }
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn a_fork_that_lands_after_the_last_search_is_found_before_the_kill_reports() {
    let mut fake = Fake::new();
    let member = fake.add_member(TREE);
    let mut fake = fake.with_marks();
    let mut kill = Kill::new(TREE, Duration::ZERO);
    // A fork that passed task_alloc before the doom shows up once the rounds have found the
    // map empty: the check of "empty" reconciles first.
    let mut late = None;
    drive(&mut kill, &mut fake, |fake| {
        if late.is_none() && fake.process(member).state != State::Running {
            late = Some(fake.fork_unseen(TREE));
        }
    })
    .unwrap();
    let late = late.expect("the fork came");
    assert_eq!(
        fake.signals(late),
        [libc::SIGKILL],
        "the late child is killed"
    );
    assert!(fake.reconciles >= 2, "a pass at the search and at the end");
}

#[test]
fn without_the_marks_a_fork_the_programs_missed_is_not_found() {
    // What the marks are for: the same fork, with nothing to reconcile it.
    let mut fake = Fake::new();
    let member = fake.add_member(TREE);
    let unseen = fake.fork_unseen(TREE);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(fake.signals(member), [libc::SIGKILL]);
    assert!(fake.signals(unseen).is_empty(), "it escapes the kill");
    assert_eq!(fake.reconciles, 0);
}

#[test]
fn a_marked_member_is_signalled_without_reading_proc_once_exits_were_skipped() {
    let mut fake = Fake::new();
    let members: Vec<Pid> = (0..10).map(|_| fake.add_member(TREE)).collect();
    let mut fake = fake.with_marks();
    fake.exit_skipped = true;
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(report.killed, members.len());
    assert_eq!(fake.proc_reads.get(), 0, "each mark is proof enough");
}

/// Other trees' members, many more than the tree killed has.
const CROWD: usize = 2000;

#[test]
fn a_complete_index_spares_the_walk_of_the_whole_map() {
    for grace in [Duration::ZERO, Duration::from_secs(5)] {
        let mut fake = Fake::new();
        let members: Vec<Pid> = (0..10).map(|_| fake.add_member(TREE)).collect();
        let crowd: Vec<Pid> = (0..CROWD).map(|_| fake.add_member(OTHER_TREE)).collect();
        let mut kill = Kill::new(TREE, grace);
        let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
        assert_eq!(report.terminated + report.killed, members.len());
        assert_eq!(fake.walks.get(), 0, "no walk of the map");
        assert!(
            fake.lookups.get() <= 3 * members.len(),
            "{} lookups: the tree's cost, not the map's",
            fake.lookups.get()
        );
        assert_eq!(fake.tree_members(TREE), 0);
        assert!(crowd.iter().all(|&pid| fake.signals(pid).is_empty()));
    }
}

#[test]
fn a_member_the_index_lacks_is_found_by_a_walk_in_the_same_round() {
    let mut fake = Fake::new();
    let indexed: Vec<Pid> = (0..10).map(|_| fake.add_member(TREE)).collect();
    // Its fork record was dropped; and a member whose exit record was dropped keeps the index
    // as large as the tree, so its size alone would pass for complete.
    let missing = fake.add_unindexed_member(TREE);
    let gone = fake.add_member(TREE);
    fake.process(gone).state = State::Reaped;
    fake.members.remove(&gone);
    for _ in 0..CROWD {
        fake.add_member(OTHER_TREE);
    }
    assert_eq!(fake.indexed(TREE).len(), fake.tree_members(TREE));
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(fake.signals(missing), [libc::SIGKILL]);
    for &pid in &indexed {
        assert_eq!(fake.signals(pid), [libc::SIGKILL]);
    }
    assert_eq!(
        (report.killed, report.rounds),
        (11, 1),
        "in the first round"
    );
    assert_eq!(fake.walks.get(), 1);
    assert!(
        report.elapsed < FULL_ROUND_EVERY,
        "not left to the periodic walk"
    );
    assert_eq!(fake.tree_members(TREE), 0);
}

#[test]
fn newborns_are_found_through_the_index_or_by_a_walk() {
    let mut fake = Fake::new();
    let parent = fake.add_member(TREE);
    let other = fake.add_member(TREE);
    fake.process(other).unkillable = true;
    let mut kill = Kill::new(TREE, Duration::ZERO);
    kill.step_on(&mut fake).unwrap();
    // A fork whose record is read before the next round: the index has the child.
    let recorded = fake.fork(parent);
    let mut unrecorded = None;
    let mut walks_before = None;
    let error = drive(&mut kill, &mut fake, |fake| {
        if unrecorded.is_none() && fake.signals(recorded) == [libc::SIGKILL] {
            walks_before = Some(fake.walks.get());
            // Its child's record is not read in time: a walk finds it.
            unrecorded = Some(fake.fork_unrecorded(recorded));
        }
    })
    .unwrap_err();
    assert!(matches!(error, KillError::Unkillable { .. }), "{error:?}");
    assert_eq!(
        walks_before,
        Some(0),
        "the first newborn came from the index"
    );
    let unrecorded = unrecorded.unwrap();
    assert_eq!(fake.signals(recorded), [libc::SIGKILL]);
    assert_eq!(fake.signals(unrecorded), [libc::SIGKILL]);
    assert!(fake.walks.get() > 0, "found by a walk");
}

#[test]
fn a_recycled_pid_in_the_index_is_never_signalled_and_leaves_it() {
    let mut fake = Fake::new();
    let live = fake.add_member(TREE);
    // Two members die and their exit records are lost; one's pid goes to a member of another
    // tree, the other's to a process no tree holds.
    let (to_other_tree, to_outsider) = (fake.add_member(TREE), fake.add_member(TREE));
    for pid in [to_other_tree, to_outsider] {
        fake.process(pid).state = State::Reaped;
        fake.members.remove(&pid);
    }
    fake.tick(Duration::from_millis(20));
    let start_ns = fake.start(to_other_tree);
    fake.members.insert(
        to_other_tree,
        Member {
            tree: OTHER_TREE,
            parent: 1,
            start_ns,
        },
    );
    fake.start(to_outsider);
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(fake.signals(live), [libc::SIGKILL]);
    assert!(
        fake.signals(to_other_tree).is_empty(),
        "the other tree's member"
    );
    assert!(fake.signals(to_outsider).is_empty(), "the outsider");
    assert_eq!(fake.process(to_outsider).state, State::Running);
    assert_eq!(report.killed, 1);
    assert_eq!(
        fake.walks.get(),
        0,
        "dead pids do not make the index look short"
    );
    assert_eq!(fake.indexed(TREE), [live], "the dead pids left the index");
    assert_eq!(fake.member(to_other_tree).map(|m| m.tree), Some(OTHER_TREE));
}

#[test]
fn a_long_kill_still_walks_the_map_now_and_then() {
    let mut fake = Fake::new();
    let stuck = fake.add_member(TREE);
    fake.process(stuck).unkillable = true;
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let mut missing = None;
    let result = drive(&mut kill, &mut fake, |fake| {
        // A member nothing counts or records (as if the counters had drifted): only a walk can
        // find it.
        if missing.is_none() && fake.elapsed > Duration::from_millis(100) {
            let pid = fake.add_unindexed_member(TREE);
            fake.joined -= 1;
            missing = Some(pid);
        }
    });
    assert!(result.is_err(), "the stuck one stays");
    assert_eq!(fake.signals(missing.unwrap()), [libc::SIGKILL]);
    assert!(fake.walks.get() >= 2);
}

#[test]
fn the_index_is_trusted_only_if_nobody_joined_or_was_put_in_meanwhile() {
    let status = |members: u64, seeded: i64, joined: u64| TreeStatus {
        tree: TREE,
        root: 0,
        members,
        seeded,
        joined,
        left: 0,
        failed_inserts: 0,
        over_quota: 0,
        root_exit_ns: None,
        doomed_ns: None,
        parent: None,
    };
    assert!(found_all(&status(3, 1, 2), &status(3, 1, 2), 3));
    assert!(
        found_all(&status(3, 1, 2), &status(2, 1, 2), 3),
        "one left after its lookup"
    );
    assert!(
        !found_all(&status(3, 1, 2), &status(3, 1, 2), 2),
        "one missing"
    );
    assert!(
        !found_all(&status(3, 1, 2), &status(4, 1, 3), 3),
        "one joined: perhaps not counted"
    );
    assert!(
        !found_all(&status(3, 1, 2), &status(4, 2, 2), 3),
        "one put in: perhaps not counted"
    );
}

#[test]
fn the_wait_for_exits_checks_one_member_a_poll_while_they_are_exiting() {
    let mut fake = Fake::new();
    let members: Vec<Pid> = (0..500).map(|_| fake.add_member(TREE)).collect();
    for &pid in &members {
        fake.process(pid).lingers = true;
    }
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let mut polls = 0;
    loop {
        match kill.step_on(&mut fake).unwrap() {
            KillStep::Wait(pause) => fake.tick(pause),
            KillStep::Done(_) => panic!("done while its members are still exiting"),
        }
        if fake.tree_members(TREE) == 0 {
            polls += 1;
        }
        if polls == 100 {
            break;
        }
    }
    assert!(
        fake.exit_checks.get() <= 100,
        "{} checks in 100 polls: each poll checks one still exiting, not all of them",
        fake.exit_checks.get()
    );
    fake.finish_exits();
    let report = drive(&mut kill, &mut fake, |_| {}).unwrap();
    assert_eq!(report.killed, members.len());
    assert!(fake.exit_checks.get() <= 100 + members.len() + 2);
}

#[test]
fn a_round_goes_out_in_one_burst_and_the_burst_ends_with_it() {
    let mut fake = Fake::new();
    for _ in 0..SIGNALS_PER_STEP * 2 + 10 {
        fake.add_member(TREE);
    }
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let mut held = Vec::new();
    loop {
        let step = kill.step_on(&mut fake).unwrap();
        held.push(fake.bursts.get());
        match step {
            KillStep::Wait(Duration::ZERO) => {}
            KillStep::Wait(_) => break,
            KillStep::Done(_) => panic!("done before its members died"),
        }
    }
    // Three steps send the round; the burst lasts from the first signal to the last, through
    // the gaps between the steps, and not a step longer.
    assert_eq!(held, [1, 1, 0]);
    drive(&mut kill, &mut fake, |fake| {
        assert_eq!(fake.bursts.get(), 0)
    })
    .unwrap();
    assert_eq!(fake.bursts.get(), 0);
}

#[test]
fn only_the_first_signals_of_a_large_kill_go_out_in_a_burst() {
    let mut fake = Fake::new();
    for _ in 0..BURST_SIGNALS * 2 {
        fake.add_member(TREE);
    }
    let mut kill = Kill::new(TREE, Duration::ZERO);
    let mut held = Vec::new();
    loop {
        let step = kill.step_on(&mut fake).unwrap();
        let sent = (fake.processes.borrow().iter())
            .filter(|p| !p.signals.is_empty())
            .count();
        held.push((sent, fake.bursts.get()));
        match step {
            KillStep::Wait(Duration::ZERO) => {}
            KillStep::Wait(_) => break,
            KillStep::Done(_) => panic!("done before its members died"),
        }
    }
    // Held while fewer than BURST_SIGNALS went out, and never again after.
    for &(sent, bursts) in &held {
        assert_eq!(bursts, usize::from(sent < BURST_SIGNALS), "{held:?}");
    }
    assert_eq!(held.last().unwrap().0, BURST_SIGNALS * 2);
}
