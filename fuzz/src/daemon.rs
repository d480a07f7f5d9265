//! The real daemon core, in this process, on a socket in a fresh directory: what
//! `leash daemon --no-pin` runs, so libFuzzer sees the coverage of its request handling.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    thread::{self, JoinHandle},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use leash::{
    Capacity,
    daemon::{Config, UidLimits},
};

use crate::janitor::{DIR_PREFIX, Janitor};

/// Grace period of trees that set none: short, as every tree the fuzzer makes is killed when
/// its connection ends.
const DEFAULT_GRACE: Duration = Duration::from_millis(100);
/// Low, so that fuzzed inputs can reach the limit (a relay conversation has up to 4 children).
const MAX_TREES_PER_UID: usize = 3;

pub struct InProcessDaemon {
    pub socket: PathBuf,
    /// Returns why the daemon stopped; taken once it has.
    thread: Option<JoinHandle<String>>,
    _janitor: Janitor,
}

impl InProcessDaemon {
    /// Starts the daemon on a tokio runtime of its own thread. It serves until the process
    /// ends: it is never stopped, since libFuzzer leaves by `exit` from another thread.
    pub fn start() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |t| t.subsec_nanos());
        let dir = PathBuf::from(format!("{DIR_PREFIX}{}-{nanos}", std::process::id()));
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        let janitor = Janitor::start(&dir).expect("starting the janitor");
        // The relay runs as another uid and must reach the socket.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        let socket = dir.join("leash.sock");
        let config = Config {
            socket: socket.clone(),
            capacity: Capacity::default(),
            default_grace: DEFAULT_GRACE,
            max_trees_per_uid: MAX_TREES_PER_UID,
            // High enough that the fuzzer's relay is never paused: every input is served.
            uid_limits: UidLimits {
                connections: 1024,
                requests_per_second: 1_000_000,
            },
            pin_root: None,
            metrics: None,
            metrics_group: None,
        };
        log_if_asked();
        let thread = thread::Builder::new()
            .name("leash-daemon".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => return format!("cannot make the tokio runtime: {e}"),
                };
                match runtime.block_on(leash::daemon::run(config)) {
                    Ok(()) => "the daemon stopped".to_owned(),
                    Err(e) => format!("{e:#}"),
                }
            })
            .expect("starting the daemon's thread");
        Self {
            socket,
            thread: Some(thread),
            _janitor: janitor,
        }
    }

    /// Why the daemon stopped, if it has (it never should).
    pub fn stopped(&mut self) -> Option<String> {
        match self.thread.take_if(|thread| thread.is_finished()) {
            Some(finished) => Some(
                finished
                    .join()
                    .unwrap_or_else(|_| "the daemon panicked".to_owned()),
            ),
            None if self.thread.is_none() => Some("the daemon stopped".to_owned()),
            None => None,
        }
    }
}

/// The daemon's log on stderr when LEASH_LOG asks for it (as `leash daemon` reads it).
fn log_if_asked() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("LEASH_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
}
