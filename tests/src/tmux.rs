//! A tmux server of a test's own, on a socket of its own: terminals to drive (keys in, screens
//! out). Killed when dropped; a failing test shows its terminal first.

use std::process::{Command, Output};

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// A server named after `name` and this process, or fails the test if tmux is missing.
    pub fn new(name: &str) -> Self {
        let tmux = Command::new("tmux").arg("-V").output();
        assert!(
            tmux.is_ok_and(|o| o.status.success()),
            "tmux is needed (cargo xtask test installs it)"
        );
        Self {
            socket: format!("leash-{name}-{}", std::process::id()),
        }
    }

    /// `tmux ARGS...` on this server.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A detached session `session`, `width` by `height`, running `command`; fails the test if
    /// tmux cannot start it.
    pub fn start(&self, session: &str, (width, height): (u16, u16), command: &str) {
        let (width, height) = (width.to_string(), height.to_string());
        let started = self.run(&[
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            &width,
            "-y",
            &height,
            command,
        ]);
        assert!(
            started.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&started.stderr)
        );
    }

    /// What `session` shows now.
    pub fn screen_of(&self, session: &str) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", session]).stdout)
            .into_owned()
    }

    /// Sends `keys` to `session` (tmux key names: `Enter`, `q`...).
    pub fn keys_to(&self, session: &str, keys: &str) {
        self.run(&["send-keys", "-t", session, keys]);
    }

    /// Whether `session` still runs.
    pub fn alive(&self, session: &str) -> bool {
        self.run(&["has-session", "-t", session]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let screen = self.run(&["capture-pane", "-p"]).stdout;
            eprintln!("the terminal:\n{}", String::from_utf8_lossy(&screen));
        }
        self.run(&["kill-server"]);
    }
}
