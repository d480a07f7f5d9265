//! A connection flood from a user namespace costs its user alone. uid 61002 runs `unshare -Ur`
//! and, from four processes, connects and closes in a loop; each connection once held three of
//! the daemon's descriptors while it waited its turn to be identified, so the daemon sat at its
//! limit and uid 61001's enforcement waited for descriptors. Now a connection is charged to its
//! SO_PEERCRED uid before it costs more than its socket, and its host's pidfds are opened only
//! once it is identified: uid 61001's `leash run` registers during the flood, and its tree dies
//! with its host.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use leash_tests::{
    Cgroup,
    daemon::{Daemon, USER_A, USER_B, path_str, setpriv_args},
    open_descriptors,
    victim::{Victim, run_true},
    wait_for,
};

/// The daemon's descriptor limit: low enough that the flood, unbounded, reaches it in well
/// under a second.
const NOFILE: u64 = 2048;

/// argv: SOCKET. Connects once and says `flooding` (once: four processes printing at once
/// interleave their words), then four processes connect and close as fast as they can, until
/// killed.
const FLOOD: &str = r#"
import os, socket, sys
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.close()
print("flooding", flush=True)
os.fork(); os.fork()
while True:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
    except OSError:
        pass
    s.close()
"#;

#[test]
fn a_flood_from_a_user_namespace_delays_no_other_users_enforcement() {
    let nofile = format!("--nofile={NOFILE}:{NOFILE}");
    let Some(daemon) = Daemon::start_wrapped(&["prlimit", &nofile, "--"], &[]) else {
        return;
    };
    // uid 61001's host, registered before the flood.
    let mut victim = Victim::start(&daemon, USER_A, "userns-flood");

    let flood_cgroup = Cgroup::new("userns-flood-flooder");
    let flooder = start_flooder(&daemon, &flood_cgroup);
    // The flood at its height: a second of it (the daemon reached its limit in under one).
    let height = Instant::now();
    let mut most_descriptors = 0;
    wait_for(Duration::from_secs(1), || {
        most_descriptors = most_descriptors.max(open_descriptors(daemon.pid()));
        false
    });
    eprintln!(
        "daemon descriptors during the flood: at most {most_descriptors} (limit {NOFILE}), \
         {:?} in",
        height.elapsed()
    );

    // A registration of uid 61001's during the flood, given a minute at most.
    let (registered, took) = run_true(&daemon, USER_A, "userns-flood", Duration::from_secs(60));
    eprintln!("uid {USER_A}'s leash run during the flood: {registered:?} after {took:?}");
    let emptied = victim.kill_host();
    eprintln!("uid {USER_A}'s tree emptied {emptied:?} after its host's SIGKILL");
    drop(flooder);
    flood_cgroup.kill_all();

    assert!(
        registered.is_some_and(|status| status.success()),
        "uid {USER_A}'s leash run failed during uid {USER_B}'s flood:\n{}",
        daemon.log()
    );
    let emptied = emptied.unwrap_or_else(|| {
        panic!(
            "uid {USER_A}'s tree outlived its host under uid {USER_B}'s flood: {:?}",
            victim.procs()
        )
    });
    assert!(emptied < Duration::from_secs(1), "{emptied:?}");
    assert!(
        most_descriptors < NOFILE / 2,
        "the flood took {most_descriptors} of the daemon's {NOFILE} descriptors"
    );
    daemon.client().status().unwrap();
}

/// The flood, as uid 61002 in a user namespace of its own (`unshare -Ur`: root there, 61002
/// outside), started once it connects. Killed with its cgroup.
struct Flooder(Child);

impl Drop for Flooder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_flooder(daemon: &Daemon, cgroup: &Cgroup) -> Flooder {
    let mut args = setpriv_args(USER_B);
    args.extend(
        [
            "unshare",
            "-Ur",
            "/usr/bin/python3",
            "-c",
            FLOOD,
            path_str(&daemon.socket),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut command: Command = cgroup.command("setpriv", &args);
    let mut child = command
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut ready,
    )
    .unwrap();
    let flooder = Flooder(child);
    assert_eq!(ready.trim(), "flooding", "the flooder did not start");
    flooder
}
