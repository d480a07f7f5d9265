//! The ring buffer's records, decoded.

use std::mem::offset_of;

use leash_common::{Event, EventKind, Pid, TreeId};

/// A decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEvent {
    pub kind: EventKind,
    pub tree: TreeId,
    pub pid: Pid,
    pub parent: Pid,
    pub time_ns: u64,
    /// The command name the event carries (see [`Event::comm`]).
    pub comm: String,
}

impl TreeEvent {
    /// Reads an [`Event`] record field by field: no alignment or validity assumptions.
    pub(super) fn decode(bytes: &[u8]) -> Option<Self> {
        let u32_at = |offset: usize| {
            Some(u32::from_ne_bytes(
                bytes.get(offset..offset + 4)?.try_into().ok()?,
            ))
        };
        let time = bytes.get(offset_of!(Event, time_ns)..offset_of!(Event, time_ns) + 8)?;
        let comm = bytes.get(offset_of!(Event, comm)..offset_of!(Event, comm) + 16)?;
        let comm = comm.split(|&b| b == 0).next().unwrap_or_default();
        Some(Self {
            kind: EventKind::from_u32(u32_at(offset_of!(Event, kind))?)?,
            tree: u32_at(offset_of!(Event, tree))?,
            pid: u32_at(offset_of!(Event, pid))?,
            parent: u32_at(offset_of!(Event, parent))?,
            time_ns: u64::from_ne_bytes(time.try_into().ok()?),
            comm: String::from_utf8_lossy(comm).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_record_decodes_and_a_short_one_does_not() {
        let event = Event {
            kind: EventKind::RootExit as u32,
            tree: 7,
            pid: 4242,
            parent: 1,
            time_ns: 123_456_789,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
        };
        let mut bytes = Vec::new();
        for word in [event.kind, event.tree, event.pid, event.parent] {
            bytes.extend(word.to_ne_bytes());
        }
        bytes.extend(event.time_ns.to_ne_bytes());
        bytes.extend(event.comm);
        assert_eq!(bytes.len(), size_of::<Event>());
        let decoded = TreeEvent::decode(&bytes).unwrap();
        assert_eq!(decoded.kind, EventKind::RootExit);
        assert_eq!((decoded.tree, decoded.pid, decoded.parent), (7, 4242, 1));
        assert_eq!(decoded.time_ns, 123_456_789);
        assert_eq!(decoded.comm, "python3");
        assert!(TreeEvent::decode(&bytes[..30]).is_none());
        bytes[0] = 99;
        assert!(
            TreeEvent::decode(&bytes).is_none(),
            "an unknown kind is dropped"
        );
    }
}
