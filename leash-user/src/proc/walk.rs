//! A process's descendants, found from the top down through the kernel's children files
//! (/proc/PID/task/TID/children): what a walk reads grows with the tree, not with the machine.
//!
//! A children file is exact only while the children are stopped. Two things make a read miss a
//! child that exists: a child that leaves the list while it is read (reaped, or handed to a
//! reaper) can make the kernel skip a sibling; and a thread that exits hands its children to
//! another thread of its process, which may have been read already. Neither goes unseen where it
//! matters. A process that is registered already is read with care: its threads are listed
//! before and after its children are read, and if they changed, or a child it listed has left
//! it by the time that child is looked at, it is read again. A process that is not registered
//! yet is read once: once it is, another pass reads it with care (see `kernel::register`).

use std::collections::HashMap;

use leash_common::Pid;

use super::{ProcessInfo, files};

/// How often a process read with care is read again before its walk goes on unsettled.
const CAREFUL_READS: usize = 4;

/// How a walk treats a process it meets, as its caller says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Find it, and walk below it: a process to register.
    Find,
    /// Walk below it without finding it (it is registered already), reading it with care.
    Through,
    /// Neither: the walk stops at it.
    Stop,
}

/// What a walk found.
#[derive(Debug, Default)]
pub struct Descendants {
    /// The processes found ([`Visit::Find`]), each before its own descendants.
    pub found: Vec<ProcessInfo>,
    pub counts: WalkCounts,
}

/// What a walk found and what it cost, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkCounts {
    /// How many processes it found.
    pub found: usize,
    /// How many processes it went below: the root, the found ones, and those walked through.
    pub walked: usize,
    /// How many files and directories of /proc it read.
    pub proc_reads: u64,
    /// How many processes read with care gave no steady answer in [`CAREFUL_READS`] reads: a
    /// walk with any proves nothing about what it did not find.
    pub unsettled: usize,
}

/// The descendants of `root` that `visit` says to find, read from the children files from
/// `root` down. `visit` is asked once about each process met (never about `root`, which is
/// walked through); the walk reads the stat of only the processes it finds, and below a
/// [`Visit::Stop`] it reads nothing. Memory and time grow with the part of the tree walked.
pub fn descendants_of(root: Pid, visit: impl FnMut(Pid) -> Visit) -> Descendants {
    let mut walk = Walk::new(root, visit, usize::MAX, |_| true);
    walk.run();
    Descendants {
        found: walk.found,
        counts: walk.counts,
    }
}

/// [`descendants_of`], handing what it finds to `deliver` as it goes, `batch` at a time (the
/// last batch may be shorter), so that what was found can be put to use while the walk goes
/// on. The walk ends early if `deliver` says so (returns false).
pub fn descendants_in_batches(
    root: Pid,
    visit: impl FnMut(Pid) -> Visit,
    batch: usize,
    deliver: impl FnMut(Vec<ProcessInfo>) -> bool,
) -> WalkCounts {
    let mut walk = Walk::new(root, visit, batch.max(1), deliver);
    walk.run();
    if !walk.found.is_empty() && !walk.stopped {
        walk.hand_over();
    }
    walk.counts
}

/// A process whose children are still to be read.
struct Pending {
    pid: Pid,
    careful: bool,
    /// Known from its stat to be one running thread: its children file is the leader's.
    single_threaded: bool,
}

impl Pending {
    fn careful(pid: Pid) -> Self {
        Self {
            pid,
            careful: true,
            single_threaded: false,
        }
    }
}

struct Walk<V, D> {
    visit: V,
    /// Every process met: true for those walked below, false where the walk stopped.
    below: HashMap<Pid, bool>,
    pending: Vec<Pending>,
    /// Reused for every children file (a fan's is one pid for each child).
    buffer: Vec<u8>,
    /// Found and not handed over yet.
    found: Vec<ProcessInfo>,
    /// How many found processes are handed over at once, and to what.
    batch: usize,
    deliver: D,
    /// Whether `deliver` said to stop.
    stopped: bool,
    counts: WalkCounts,
}

impl<V: FnMut(Pid) -> Visit, D: FnMut(Vec<ProcessInfo>) -> bool> Walk<V, D> {
    fn new(root: Pid, visit: V, batch: usize, deliver: D) -> Self {
        Self {
            visit,
            below: HashMap::from([(root, true)]),
            pending: vec![Pending::careful(root)],
            buffer: Vec::new(),
            found: Vec::new(),
            batch,
            deliver,
            stopped: false,
            counts: WalkCounts::default(),
        }
    }

    fn run(&mut self) {
        while let Some(next) = self.pending.pop() {
            if self.stopped {
                return;
            }
            self.read_below(next);
        }
    }

    /// Hands what was found so far to `deliver`.
    fn hand_over(&mut self) {
        let batch = std::mem::take(&mut self.found);
        if !(self.deliver)(batch) {
            self.stopped = true;
        }
    }

    /// Reads the children of `process` and takes each one the walk has not met yet. Read with
    /// care, it is read again until its threads and its children hold still through a read.
    fn read_below(&mut self, process: Pending) {
        self.counts.walked += 1;
        for _ in 0..CAREFUL_READS {
            let Some(threads) = self.threads_of(&process) else {
                // Gone: its children went to a reaper, out of its subtree.
                return;
            };
            let children = self.children_of(process.pid, &threads);
            if !process.careful {
                self.take(&children);
                return;
            }
            let threads_held = self.list_threads(process.pid).as_ref() == Some(&threads);
            // Both, always: what this read found is taken whatever the next one finds.
            if self.take(&children) && threads_held {
                return;
            }
        }
        tracing::debug!(
            pid = process.pid,
            "its children did not hold still to be read"
        );
        self.counts.unsettled += 1;
    }

    /// The threads whose children files hold `process`'s children; None if it is gone.
    fn threads_of(&mut self, process: &Pending) -> Option<Vec<Pid>> {
        if process.single_threaded && !process.careful {
            return Some(vec![process.pid]);
        }
        self.list_threads(process.pid)
    }

    /// The thread ids of `pid`, sorted; None if it is gone.
    fn list_threads(&mut self, pid: Pid) -> Option<Vec<Pid>> {
        self.counts.proc_reads += 1;
        let mut threads: Vec<Pid> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        threads.sort_unstable();
        Some(threads)
    }

    /// The children of `pid`'s `threads`. A thread gone meanwhile has handed its children to
    /// another: the caller sees the threads changed.
    fn children_of(&mut self, pid: Pid, threads: &[Pid]) -> Vec<Pid> {
        let mut children = Vec::new();
        for tid in threads {
            self.counts.proc_reads += 1;
            let path = format!("/proc/{pid}/task/{tid}/children");
            if files::read_to_end(&path, &mut self.buffer).is_err() {
                continue;
            }
            let text = String::from_utf8_lossy(&self.buffer);
            children.extend(
                text.split_ascii_whitespace()
                    .filter_map(|c| c.parse::<Pid>().ok()),
            );
        }
        children
    }

    /// Takes the children one read listed: each one met for the first time is walked below or
    /// not, and found or not, as `visit` says. Returns false if one of them has left its
    /// parent since (gone, or handed to a reaper), which may have made the read skip another.
    fn take(&mut self, children: &[Pid]) -> bool {
        let mut steady = true;
        for &child in children {
            if self.stopped {
                break;
            }
            if self.below.contains_key(&child) {
                continue;
            }
            match (self.visit)(child) {
                Visit::Stop => {
                    self.below.insert(child, false);
                }
                Visit::Through => {
                    self.below.insert(child, true);
                    self.pending.push(Pending::careful(child));
                }
                Visit::Find => steady &= self.find(child),
            }
        }
        steady
    }

    /// Finds `child` if its stat says it still has a parent the walk went below (its own, or
    /// a reaper in the tree its own was handed to); false if it does not, or is gone.
    fn find(&mut self, child: Pid) -> bool {
        self.counts.proc_reads += 1;
        let Some((process, threads)) = read_stat(child, &mut self.buffer) else {
            return false;
        };
        if self.below.get(&process.ppid) != Some(&true) {
            return false;
        }
        self.below.insert(child, true);
        self.pending.push(Pending {
            pid: child,
            careful: false,
            // A zombie leader's children are with its other threads, which it counts.
            single_threaded: threads == 1 && process.is_live(),
        });
        self.found.push(process);
        self.counts.found += 1;
        if self.found.len() >= self.batch {
            self.hand_over();
        }
        true
    }
}

/// The process `pid` names and its number of threads, from one read of its stat; None if it
/// is gone (or cannot be read).
fn read_stat(pid: Pid, buffer: &mut Vec<u8>) -> Option<(ProcessInfo, i64)> {
    let stat = files::stat(pid, buffer)?;
    let threads = stat.num_threads;
    Some((ProcessInfo::from_stat(stat), threads))
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeSet,
        os::unix::process::CommandExt,
        process::{Child, Command, Stdio},
        sync::mpsc,
        time::{Duration, Instant},
    };

    use super::*;
    use crate::proc::{all_processes, descendants};

    /// A shell with children and grandchildren, all asleep, in a process group of its own;
    /// the whole group is killed however the test ends.
    struct SleepingTree(Child);

    impl SleepingTree {
        /// The root, two sleeps and a shell with two sleeps of its own: five descendants.
        fn start() -> Self {
            let script = r#"sleep 600 & sleep 600 & sh -c 'sleep 600 & sleep 600 & wait' & wait"#;
            let root = Command::new("sh")
                .args(["-c", script])
                .process_group(0)
                .stdin(Stdio::null())
                .spawn()
                .expect("starting sh");
            let tree = Self(root);
            let deadline = Instant::now() + Duration::from_secs(10);
            while tree.ground_truth().len() < 5 {
                assert!(Instant::now() < deadline, "the tree did not form");
                std::thread::sleep(Duration::from_millis(1));
            }
            tree
        }

        fn root(&self) -> Pid {
            self.0.id()
        }

        /// Its descendants, from every process's stat.
        fn ground_truth(&self) -> Vec<ProcessInfo> {
            let snapshot = all_processes().expect("reading /proc");
            descendants(&snapshot, self.root(), |_| false)
                .into_iter()
                .cloned()
                .collect()
        }
    }

    impl Drop for SleepingTree {
        fn drop(&mut self) {
            let group = format!("-{}", self.root());
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &group])
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn pids(processes: &[ProcessInfo]) -> BTreeSet<Pid> {
        processes.iter().map(|p| p.pid).collect()
    }

    #[test]
    fn the_children_files_find_what_every_stat_shows() {
        let tree = SleepingTree::start();
        let truth = tree.ground_truth();
        let walk = descendants_of(tree.root(), |_| Visit::Find);
        assert_eq!(pids(&walk.found), pids(&truth));
        assert_eq!(walk.counts.found, truth.len());
        assert_eq!(walk.counts.walked, 1 + truth.len());
        assert_eq!(walk.counts.unsettled, 0, "nothing moved");
        // The root, read with care: its threads twice and its children file; each found
        // process, one thread: its stat and its children file. Nothing else on the machine.
        assert_eq!(walk.counts.proc_reads, 3 + 2 * truth.len() as u64);
        for (at, process) in walk.found.iter().enumerate() {
            let parent_before = process.ppid == tree.root()
                || walk.found[..at].iter().any(|p| p.pid == process.ppid);
            assert!(parent_before, "each process after its parent: {walk:?}");
        }
    }

    #[test]
    fn a_walk_in_batches_hands_over_what_a_whole_walk_finds() {
        let tree = SleepingTree::start();
        let whole = descendants_of(tree.root(), |_| Visit::Find);
        let mut batches = Vec::new();
        let counts = descendants_in_batches(
            tree.root(),
            |_| Visit::Find,
            2,
            |batch| {
                batches.push(batch);
                true
            },
        );
        let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, [2, 2, 1], "as soon as each batch is full");
        assert_eq!(pids(&batches.concat()), pids(&whole.found));
        assert_eq!(counts, whole.counts);

        let mut delivered = 0;
        let stopped = descendants_in_batches(
            tree.root(),
            |_| Visit::Find,
            2,
            |_| {
                delivered += 1;
                false
            },
        );
        assert_eq!(delivered, 1, "nothing after a refused batch");
        assert_eq!(stopped.found, 2);
    }

    #[test]
    fn the_walk_stops_where_told_and_walks_through_without_finding() {
        let tree = SleepingTree::start();
        let truth = tree.ground_truth();
        let shell = truth
            .iter()
            .find(|p| p.ppid == tree.root() && p.comm == "sh")
            .expect("the inner shell")
            .pid;
        let below_shell = pids(
            &truth
                .iter()
                .filter(|p| p.ppid == shell)
                .cloned()
                .collect::<Vec<_>>(),
        );
        assert_eq!(below_shell.len(), 2);

        let stopped = descendants_of(tree.root(), |pid| {
            if pid == shell {
                Visit::Stop
            } else {
                Visit::Find
            }
        });
        let mut expected = pids(&truth);
        expected.remove(&shell);
        expected.retain(|pid| !below_shell.contains(pid));
        assert_eq!(
            pids(&stopped.found),
            expected,
            "nothing at or below the stop"
        );

        let through = descendants_of(tree.root(), |pid| {
            if pid == shell {
                Visit::Through
            } else {
                Visit::Find
            }
        });
        let mut expected = pids(&truth);
        expected.remove(&shell);
        assert_eq!(pids(&through.found), expected, "below it, not it");
        assert_eq!(through.counts.unsettled, 0);
    }

    #[test]
    fn a_child_of_another_thread_is_found() {
        let (spawned, child) = mpsc::channel();
        let (done, finish) = mpsc::channel::<()>();
        // The child's parent is this thread, not the process's main thread; it is killed when
        // the thread ends, which is when the test is done with it or has failed.
        let thread = std::thread::spawn(move || {
            let mut sleep = Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("starting sleep");
            let _ = spawned.send(sleep.id());
            let _ = finish.recv();
            let _ = sleep.kill();
            let _ = sleep.wait();
        });
        let sleep = child.recv().expect("the thread started sleep");
        let me = std::process::id();
        // Tests run on threads of their own: the main thread is not this one's parent.
        let leaders = std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap();
        assert!(
            !leaders.split_whitespace().any(|c| c == sleep.to_string()),
            "the sleep must be a child of another thread than the main one"
        );
        let walk = descendants_of(me, |pid| {
            if pid == sleep {
                Visit::Find
            } else {
                Visit::Stop
            }
        });
        drop(done);
        thread.join().unwrap();
        assert_eq!(pids(&walk.found), BTreeSet::from([sleep]));
    }
}
