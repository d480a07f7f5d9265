//! One fuzz input against the daemon: the relay sends it on a new connection and brings back
//! the answer, which must hold together (see [`replies`](crate::replies)); then the daemon must
//! still answer `status` on a fresh connection, and must have ended that connection's lease
//! and every tree it held.

use std::{
    sync::Mutex,
    thread,
    time::{Duration, Instant},
};

use leash_client::protocol::{Reply, ServerLine, StatusInfo, TreeId};

use crate::{
    daemon::InProcessDaemon,
    preview,
    relay::{Conversation, Ending, Relay},
    replies,
};

/// In an input, `$TREE` becomes the id the daemon gives the next tree it registers, so that
/// fuzzed requests can name a tree they made (with `$CHILD`, see the relay).
pub const TREE_PLACEHOLDER: &[u8] = b"$TREE";
/// How long the daemon has to start (loading the programs).
const START_DEADLINE: Duration = Duration::from_secs(60);
/// How long, after a connection closed, its lease and trees may take to be gone.
const SETTLE_DEADLINE: Duration = Duration::from_secs(10);
/// A relay that keeps dying is a fault of the harness, not a finding.
const RELAY_DEATHS_IN_A_ROW: u32 = 3;
const STATUS: &[u8] = b"{\"id\":1,\"op\":\"status\"}\n";

static HARNESS: Mutex<Option<Harness>> = Mutex::new(None);

/// Says so when libFuzzer was not given `-detect_leaks=0`: the daemon's threads allocate while
/// each input runs, so libFuzzer would search the heap for leaks after nearly every input, at a
/// tenth of the speed.
pub fn advise_on_flags() {
    let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    if !cmdline
        .split(|&b| b == 0)
        .any(|arg| arg.starts_with(b"-detect_leaks="))
    {
        eprintln!(
            "leash fuzz: run this target with -detect_leaks=0 (cargo fuzz run connection -- \
             -detect_leaks=0), or it runs ten times slower; `cargo xtask fuzz` does"
        );
    }
}

/// Runs one input, starting the daemon and the relay at the first.
pub fn run(input: &[u8]) {
    let mut harness = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    harness.get_or_insert_with(Harness::start).run(input);
}

struct Harness {
    daemon: InProcessDaemon,
    relay: Option<Relay>,
    relay_deaths: u32,
    /// The id of the next tree, as far as the replies tell.
    next_tree: TreeId,
}

impl Harness {
    fn start() -> Self {
        let mut harness = Self {
            daemon: InProcessDaemon::start(),
            relay: None,
            relay_deaths: 0,
            next_tree: 1,
        };
        let deadline = Instant::now() + START_DEADLINE;
        while harness.status().is_none() {
            if let Some(why) = harness.daemon.stopped() {
                panic!("the leash daemon did not start (it needs root and BPF): {why}");
            }
            assert!(
                Instant::now() < deadline,
                "the leash daemon did not answer within {START_DEADLINE:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
        harness
    }

    fn run(&mut self, input: &[u8]) {
        let input = replace(
            input,
            TREE_PLACEHOLDER,
            self.next_tree.to_string().as_bytes(),
        );
        // The relay is gone (a fuzzed request may have found its pid and killed it): nothing
        // to check but that the daemon goes on.
        if let Some(conversation) = self.converse(&input) {
            for line in replies::check(&input, &conversation) {
                if let ServerLine::Reply {
                    ok: Reply::Registered { tree, .. },
                    ..
                } = line
                {
                    self.next_tree = self.next_tree.max(tree.saturating_add(1));
                }
            }
        }
        self.settle(&input);
    }

    /// Waits until the daemon answers `status` on a fresh connection and counts no lease but
    /// that connection's and no tree: the input's lease has ended, and every tree it held is
    /// gone.
    fn settle(&mut self, input: &[u8]) {
        let deadline = Instant::now() + SETTLE_DEADLINE;
        let mut pause = Duration::from_micros(200);
        loop {
            let status = self.status();
            if let Some(StatusInfo {
                leases: 1,
                trees: 0,
                ..
            }) = status
            {
                return;
            }
            if let Some(why) = self.daemon.stopped() {
                panic!(
                    "the daemon stopped: {why}\n--- input ---\n{}",
                    preview(input)
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "{SETTLE_DEADLINE:?} after the connection closed, the daemon's status is \
                     {status:?} (expected: only the asking lease, no tree)\n--- input ---\n{}",
                    preview(input)
                );
            }
            thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// The daemon's status, asked on a new connection; None if it did not answer or does not
    /// listen (yet).
    fn status(&mut self) -> Option<StatusInfo> {
        let conversation = self.converse(STATUS)?;
        if conversation.ending == Ending::ConnectFailed {
            return None;
        }
        let lines = replies::check(STATUS, &conversation);
        lines
            .into_iter()
            .find_map(|line: ServerLine| match line {
                ServerLine::Reply {
                    ok: Reply::Status(status),
                    ..
                } => Some(status),
                _ => None,
            })
    }

    fn converse(&mut self, input: &[u8]) -> Option<Conversation> {
        let relay = self
            .relay
            .get_or_insert_with(|| Relay::start(&self.daemon.socket));
        match relay.converse(input) {
            Ok(conversation) => {
                self.relay_deaths = 0;
                Some(conversation)
            }
            Err(e) => {
                let pid = relay.pid();
                self.relay = None;
                self.relay_deaths += 1;
                assert!(
                    self.relay_deaths < RELAY_DEATHS_IN_A_ROW,
                    "the relay died {RELAY_DEATHS_IN_A_ROW} times in a row (last: {pid}, {e})"
                );
                None
            }
        }
    }
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(at) = rest.windows(from.len()).position(|window| window == from) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(to);
        rest = &rest[at + from.len()..];
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_everywhere() {
        assert_eq!(replace(b"a$TREEb$TREE", TREE_PLACEHOLDER, b"12"), b"a12b12");
        assert_eq!(replace(b"$TRE", TREE_PLACEHOLDER, b"1"), b"$TRE");
    }
}
