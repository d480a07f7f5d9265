//! `leash watch` in a real terminal (tmux): the tree's pids show up on the screen, `K` then `y`
//! kills the tree, its members' exits are shown as the kill's, its pids go from the screen, `q`
//! quits.

use std::{
    process::{Command, Output},
    time::Duration,
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, path_str},
    leash_binary, wait_for,
};

/// A tmux server of the test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Self {
        let tmux = Command::new("tmux").arg("-V").output();
        assert!(
            tmux.is_ok_and(|o| o.status.success()),
            "tmux is needed (cargo xtask test installs it)"
        );
        Self {
            socket: format!("leash-test-{}", std::process::id()),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "watch"]).stdout)
            .into_owned()
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", "watch", keys]);
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "watch"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

#[test]
fn watch_shows_the_tree_and_kills_it_with_k() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("watch-tmux");
    let mut host = daemon
        .leash()
        .args(["run", "--"])
        .args(cgroup.argv("sh", &["-c", "setsid sleep 600 & exec sleep 600"]))
        .spawn()
        .unwrap();
    let pids = cgroup.settle_exactly(&["sleep", "sleep"]);

    let tmux = Tmux::new();
    let watch = format!(
        "{} --socket {} watch",
        path_str(&leash_binary()),
        path_str(&daemon.socket)
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "watch",
        "-x",
        "100",
        "-y",
        "30",
        &watch,
    ]);
    assert!(
        started.status.success(),
        "tmux: {}",
        String::from_utf8_lossy(&started.stderr)
    );

    let on_screen = |screen: &str| pids.iter().all(|pid| screen.contains(&pid.to_string()));
    assert!(
        wait_for(Duration::from_secs(20), || on_screen(&tmux.screen())),
        "pids not shown:\n{}",
        tmux.screen()
    );
    eprintln!("leash watch, live:\n{}", tmux.screen());

    // The first line is the lease; the next is the tree.
    tmux.keys("j");
    tmux.keys("K");
    assert!(
        wait_for(Duration::from_secs(10), || tmux.screen().contains("? y/n")),
        "no confirmation:\n{}",
        tmux.screen()
    );
    tmux.keys("y");
    let emptied = cgroup.wait_empty(Duration::from_secs(20));
    assert!(emptied.is_some(), "K did not kill the tree");
    assert!(
        wait_for(Duration::from_secs(10), || {
            let screen = tmux.screen();
            screen.contains("trees 0")
                && pids
                    .iter()
                    .all(|pid| !screen.contains(&format!("  {pid} ")))
        }),
        "the killed tree is still shown:\n{}",
        tmux.screen()
    );
    // The processes' exits while their tree is killed are shown as the kill's, not as
    // ordinary activity that reads like an escape.
    assert!(
        wait_for(Duration::from_secs(10), || tmux
            .screen()
            .contains("(sleep) exited during the kill")),
        "the exits of the kill are not shown as the kill's:\n{}",
        tmux.screen()
    );
    eprintln!("after K, y:\n{}", tmux.screen());

    tmux.keys("q");
    assert!(
        wait_for(Duration::from_secs(10), || !tmux.alive()),
        "q did not quit"
    );
    let _ = host.wait();
}
