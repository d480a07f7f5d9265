//! The host libraries list the protocol's words as the daemon writes them: every event kind and
//! every kill reason, no more and no fewer, in the Python library's `Literal` types and in the
//! Node library's declared unions. A word added to the daemon without them fails here.

use std::{collections::BTreeSet, fs, path::Path};

use leash_client::protocol::{EventKind, KillReason};

/// The word the wire writes for a value (`serde_json::to_value` of it).
fn word(value: serde_json::Result<serde_json::Value>) -> String {
    match value.unwrap() {
        serde_json::Value::String(word) => word,
        other => panic!("{other} is not a word"),
    }
}

fn event_kinds() -> BTreeSet<String> {
    EventKind::ALL
        .iter()
        .map(|kind| word(serde_json::to_value(kind)))
        .collect()
}

fn kill_reasons() -> BTreeSet<String> {
    KillReason::ALL
        .iter()
        .map(|reason| word(serde_json::to_value(reason)))
        .collect()
}

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The quoted words from `start` to the first `end` after it.
fn quoted_between(text: &str, start: &str, end: &str) -> BTreeSet<String> {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not found"));
    let rest = &text[from + start.len()..];
    let to = rest
        .find(end)
        .unwrap_or_else(|| panic!("{end:?} not found after {start:?}"));
    rest[..to]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_python_library_lists_every_event_kind_and_kill_reason() {
    let protocol = read("clients/python/src/leash/protocol.py");
    assert_eq!(
        quoted_between(&protocol, "EventKind = Literal[", "]"),
        event_kinds()
    );
    assert_eq!(
        quoted_between(&protocol, "KillReason = Literal[", "]"),
        kill_reasons()
    );
}

#[test]
fn the_node_library_lists_every_event_kind_and_kill_reason() {
    let types = read("clients/node/index.d.ts");
    let event = &types[types.find("export interface LeashEvent").unwrap()..];
    assert_eq!(
        quoted_between(event, "kind:", "(string & {})"),
        event_kinds()
    );
    let summary = &types[types.find("export interface KillSummary").unwrap()..];
    assert_eq!(
        quoted_between(summary, "reason:", "(string & {})"),
        kill_reasons()
    );
}
