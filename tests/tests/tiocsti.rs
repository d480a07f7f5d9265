//! An agent cannot type into its user's shell: under `leash run` at a terminal (a shell in
//! tmux), an agent running as another uid pushes `touch MARKER` into its terminal's input with
//! ioctl TIOCSTI and exits; once `leash run` returns, the shell has run nothing. With
//! `--no-pty` the same agent shares the shell's terminal and the shell runs it: the attack is
//! real here. The pty also relays the command's output, `leash run` returns its status, and
//! SIGTERM to `leash run` kills the tree and leaves the terminal in its own mode. Ctrl-Z stops
//! the command and `leash run` with it, and the shell's `fg` continues both (the kernel alone
//! would drop the pty's SIGTSTP: the command's process group is orphaned).

use std::{fs, os::unix::fs::PermissionsExt, path::Path, time::Duration};

use leash_tests::{
    daemon::{Daemon, USER_A, path_str, setpriv_args, signal},
    python,
    tmux::Tmux,
    wait_for,
};

/// Pushes MARKER's `touch` into the terminal on its standard input, a byte at a time, as
/// typed keys, and exits.
const AGENT: &str = "import fcntl, sys, termios\n\
    for c in 'touch ' + sys.argv[1] + '\\n':\n    \
    fcntl.ioctl(0, termios.TIOCSTI, c.encode())\n";

/// A shell, `sh`, in the session "shell" of a tmux server of the test's own.
struct Shell(Tmux);

impl Shell {
    /// `name` names the tmux server: each test has its own.
    fn start(name: &str) -> Self {
        let tmux = Tmux::new(name);
        tmux.start("shell", (150, 40), "env PS1='$ ' sh");
        Self(tmux)
    }

    fn screen(&self) -> String {
        self.0.screen_of("shell")
    }

    /// Types `line` into the shell, then Enter.
    fn type_line(&self, line: &str) {
        self.0.run(&["send-keys", "-t", "shell", "-l", line]);
        self.0.keys_to("shell", "Enter");
    }

    /// Types `line`, waits for the shell to have run it, then types a line of its own and
    /// waits for that too: the shell has then also run whatever was pushed into its input
    /// meanwhile. (Keys typed while `leash run` runs are the command's.)
    fn type_and_wait(&self, line: &str, n: u32) {
        self.type_line(&format!("{line}; echo ran-$(({n}+1000))"));
        self.wait_for_word(&format!("ran-{}", n + 1000));
        self.type_line(&format!("echo end-$(({n}+2000))"));
        self.wait_for_word(&format!("end-{}", n + 2000));
    }

    /// Waits for `word` on the screen (the typed line computes it, so it does not show it).
    fn wait_for_word(&self, word: &str) {
        let mut screen = String::new();
        assert!(
            wait_for(Duration::from_secs(15), || {
                screen = self.screen();
                screen.contains(word)
            }),
            "the shell did not get to `{word}`:\n{screen}"
        );
    }
}

#[test]
fn an_agent_under_leash_run_cannot_type_into_its_users_shell() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let agent = daemon.dir.join("agent.py");
    fs::write(&agent, AGENT).unwrap();
    fs::set_permissions(&agent, fs::Permissions::from_mode(0o644)).unwrap();
    // The kernel lets a process push input only into its controlling terminal, and, where
    // dev.tty.legacy_tiocsti is 0, only with CAP_SYS_ADMIN: then the agent runs as root, to
    // whom the kernel still allows it, so that the attack is real on every kernel.
    let legacy = fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
        .map_or(true, |value| value.trim() != "0");
    let agent_as = if legacy {
        let mut argv = vec!["setpriv".to_owned()];
        argv.extend(setpriv_args(USER_A));
        argv.join(" ")
    } else {
        eprintln!("dev.tty.legacy_tiocsti is 0: the agent runs as root, who may use TIOCSTI");
        String::new()
    };
    let run = |flags: &str, marker: &Path| {
        format!(
            "{leash} --socket {socket} run {flags} -- {agent_as} {python} {agent} {marker}",
            leash = path_str(&daemon.leash_for_anyone()),
            socket = path_str(&daemon.socket),
            python = python(),
            agent = path_str(&agent),
            marker = path_str(marker),
        )
    };
    let tmux = Shell::start("tiocsti");

    // Its own pty: the keys went to it, and nothing ran in the shell.
    let blocked = daemon.dir.join("typed-through-the-pty");
    tmux.type_and_wait(&run("", &blocked), 1);
    assert!(
        !blocked.exists(),
        "the shell ran what the agent typed under `leash run`:\n{}",
        tmux.screen()
    );

    // Sharing the terminal: the shell ran it.
    let typed = daemon.dir.join("typed-into-the-shell");
    tmux.type_and_wait(&run("--no-pty", &typed), 2);
    assert!(
        typed.exists(),
        "with --no-pty the agent's TIOCSTI did not reach the shell, so this test shows \
         nothing:\n{}",
        tmux.screen()
    );

    // Through the pty: the command's output, its status, and a terminal that is not the
    // shell's.
    tmux.type_and_wait(
        &format!(
            "{leash} --socket {socket} run -- sh -c 'echo out-$((6*7)) $(tty); exit 3'; \
             echo status-$((0+$?)) $(tty)",
            leash = path_str(&daemon.leash_for_anyone()),
            socket = path_str(&daemon.socket),
        ),
        3,
    );
    let screen = tmux.screen();
    let word_after = |word: &str| {
        screen
            .lines()
            .find_map(|line| line.strip_prefix(word))
            .map(|rest| rest.trim().to_owned())
    };
    let inner = word_after("out-42 ").unwrap_or_else(|| panic!("no output:\n{screen}"));
    let outer = word_after("status-3 ").unwrap_or_else(|| panic!("not status 3:\n{screen}"));
    assert!(inner.starts_with("/dev/pts/"), "{screen}");
    assert_ne!(
        inner, outer,
        "the command had the shell's terminal:\n{screen}"
    );

    // SIGTERM to `leash run` still kills the tree, and the terminal gets its mode back.
    tmux.type_line(&format!(
        "{leash} --socket {socket} run -- sh -c 'echo leash-pid-$PPID; exec sleep 100'; \
         echo status-$((0+$?)); stty -a | grep -q -- -icanon || echo cooked-$((1+1))",
        leash = path_str(&daemon.leash_for_anyone()),
        socket = path_str(&daemon.socket),
    ));
    let mut leash_pid = None;
    assert!(
        wait_for(Duration::from_secs(15), || {
            leash_pid = tmux.screen().lines().find_map(|line| {
                line.strip_prefix("leash-pid-")
                    .and_then(|pid| pid.trim().parse::<u32>().ok())
            });
            leash_pid.is_some()
        }),
        "the command did not start:\n{}",
        tmux.screen()
    );
    signal(leash_pid.unwrap(), "TERM");
    tmux.wait_for_word("cooked-2");
    let screen = tmux.screen();
    assert!(screen.contains("status-143"), "{screen}");
}

#[test]
fn ctrl_z_stops_the_command_and_fg_continues_it() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let tmux = Shell::start("ctrl-z");
    tmux.type_line(&format!(
        "{leash} --socket {socket} run -- sh -c 'echo root-$$; exec sleep 600'",
        leash = path_str(&daemon.leash_for_anyone()),
        socket = path_str(&daemon.socket),
    ));
    let mut root = None;
    assert!(
        wait_for(Duration::from_secs(15), || {
            root = tmux.screen().lines().find_map(|line| {
                line.strip_prefix("root-")
                    .and_then(|pid| pid.trim().parse::<u32>().ok())
            });
            root.is_some()
        }),
        "the command did not start:\n{}",
        tmux.screen()
    );
    let root = root.unwrap();
    // `leash run` is the command's parent: keys typed before it exits are the command's.
    let leash_run = fs::read_to_string(format!("/proc/{root}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().nth(1)?.parse::<u32>().ok()
        })
        .expect("the command's parent");
    // Waits for process `pid` to be in state `wanted`.
    let state_of = |pid: u32, wanted: char| {
        wait_for(Duration::from_secs(15), || {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next())
                    == Some(wanted)
            })
        })
    };

    tmux.0.keys_to("shell", "C-z");
    assert!(
        state_of(root, 'T'),
        "Ctrl-Z did not stop the command ({:?}):\n{}",
        fs::read_to_string(format!("/proc/{root}/stat")),
        tmux.screen()
    );
    // `leash run` stopped too: the shell has the terminal back, and runs what is typed.
    assert!(
        state_of(leash_run, 'T'),
        "`leash run` did not stop with the command:\n{}",
        tmux.screen()
    );
    tmux.type_and_wait("true", 1);

    tmux.type_line("fg");
    assert!(
        state_of(root, 'S'),
        "fg did not continue the command:\n{}",
        tmux.screen()
    );
    // Ctrl-C ends it (a job the shell continued: its list went on when it stopped, so no
    // status is shown), and the shell has the terminal again.
    tmux.0.keys_to("shell", "C-c");
    let gone = |pid: u32| !Path::new(&format!("/proc/{pid}")).exists();
    assert!(
        wait_for(Duration::from_secs(15), || gone(root) && gone(leash_run)),
        "Ctrl-C did not end the command and `leash run`:\n{}",
        tmux.screen()
    );
    tmux.type_and_wait("true", 2);
}
