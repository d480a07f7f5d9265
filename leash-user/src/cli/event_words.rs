//! Events as the CLI says them when it does not know their kind: a daemon newer than this
//! leash may send kinds it has no name for (docs/PROTOCOL.md adds kinds without a new protocol
//! version), and a viewer shows them, generically, rather than fail.

use leash_client::{Event, EventKind};

/// The kind's word on the wire (`kill_started`), or `?` if it has none.
pub(super) fn kind_word(kind: EventKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(word)) => word,
        _ => "?".to_owned(),
    }
}

/// Any event in words, from the fields every kind may carry: `tree 3: closing (shutdown)`.
pub(super) fn generic(event: &Event) -> String {
    let mut text = String::new();
    if event.tree != 0 {
        text.push_str(&format!("tree {}: ", event.tree));
    }
    text.push_str(&kind_word(event.kind));
    if let Some(pid) = event.pid {
        text.push_str(&format!(" pid {pid}"));
    }
    if let Some(comm) = &event.comm {
        text.push_str(&format!(" ({comm})"));
    }
    if let Some(reason) = &event.reason {
        text.push_str(&format!(" ({reason})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_said_by_its_wire_word() {
        assert_eq!(kind_word(EventKind::KillStarted), "kill_started");
        let mut event = Event::new(EventKind::Released, 3, 7, Some(4242));
        event.reason = Some(leash_client::EventReason::Unknown("why".into()));
        assert_eq!(generic(&event), "tree 3: released pid 4242 (why)");
        assert_eq!(
            generic(&Event::new(EventKind::Dropped, 0, 0, None)),
            "dropped"
        );
    }
}
