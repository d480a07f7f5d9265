//! Another user's host and tree, for the tests that show that one user's load delays no other
//! user's enforcement: registered before the load, its host SIGKILLed during it, and a
//! `leash run` of theirs made meanwhile.

use std::{
    process::{Child, ExitStatus},
    time::{Duration, Instant},
};

use crate::{
    Cgroup,
    daemon::{Daemon, signal},
    wait_for,
};

/// A host (`leash run`) of one user's and its tree: a sleep in a session of its own, and one
/// that is not. Its cgroup holds them all; dropped, it is killed.
pub struct Victim {
    host: Child,
    cgroup: Cgroup,
}

impl Victim {
    /// `uid`'s host in a cgroup named after `name`, once it and its tree have started.
    pub fn start(daemon: &Daemon, uid: u32, name: &str) -> Self {
        let cgroup = Cgroup::new(&format!("{name}-victim"));
        let host = daemon
            .leash_as(
                uid,
                &cgroup,
                &["run", "--", "sh", "-c", "setsid sleep 600 & sleep 600"],
            )
            .spawn()
            .unwrap();
        let victim = Self { host, cgroup };
        assert!(
            wait_for(Duration::from_secs(20), || victim.cgroup.procs().len() >= 4),
            "the host and its tree did not start: {:?}",
            victim.cgroup.procs()
        );
        victim
    }

    /// SIGKILLs the host: how long its tree took to empty after that (None: not in 10 s).
    pub fn kill_host(&mut self) -> Option<Duration> {
        signal(self.host.id(), "KILL");
        let killed = Instant::now();
        let _ = self.host.wait();
        let emptied = wait_for(Duration::from_secs(10), || self.cgroup.procs().is_empty());
        emptied.then(|| killed.elapsed())
    }

    /// What is left in its cgroup.
    pub fn procs(&self) -> std::collections::BTreeSet<crate::Pid> {
        self.cgroup.procs()
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.host.kill();
        let _ = self.host.wait();
        self.cgroup.kill_all();
    }
}

/// `leash run -- true` as `uid`, given `within`: its exit status (None: it had not exited by
/// then, and was killed) and how long it took.
pub fn run_true(
    daemon: &Daemon,
    uid: u32,
    name: &str,
    within: Duration,
) -> (Option<ExitStatus>, Duration) {
    let started = Instant::now();
    let cgroup = Cgroup::new(&format!("{name}-run"));
    let mut run = daemon
        .leash_as(uid, &cgroup, &["run", "--", "true"])
        .spawn()
        .unwrap();
    let mut status = None;
    wait_for(within, || {
        status = run.try_wait().ok().flatten();
        status.is_some()
    });
    if status.is_none() {
        let _ = run.kill();
        let _ = run.wait();
    }
    (status, started.elapsed())
}
