//! An event's `reason`: one string on the wire, whose words depend on the event's kind.

use std::fmt;

use serde::{Serialize, Serializer};

use super::{ClosingReason, EventKind};
use crate::protocol::KillReason;

/// Why an event came, or what failed: the `reason` of `kill_started`, `kill_failed` and
/// `closing`. On the wire it is a plain string whatever the variant; which variant a string is
/// depends on the event's kind (`shutdown` is both a kill reason and a closing reason), so it
/// is read with the kind, by [`EventReason::from_word`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// `kill_started`: why the tree is killed.
    Kill(KillReason),
    /// `kill_failed`: what failed, in words.
    Failure(String),
    /// `closing`: why the daemon closes the connection.
    Closing(ClosingReason),
    /// A word this leash does not know for the event's kind: a newer daemon's, or a reason on
    /// a kind that carries none. Kept as sent rather than refused, so that the rest of the
    /// event is still read.
    Unknown(String),
}

impl EventReason {
    /// The reason `word` carried by an event of `kind`.
    pub fn from_word(kind: EventKind, word: String) -> Self {
        let known = match kind {
            EventKind::KillStarted => KillReason::ALL
                .into_iter()
                .find(|reason| reason.as_str() == word)
                .map(Self::Kill),
            EventKind::Closing => ClosingReason::ALL
                .into_iter()
                .find(|reason| reason.as_str() == word)
                .map(Self::Closing),
            EventKind::KillFailed => return Self::Failure(word),
            _ => None,
        };
        known.unwrap_or(Self::Unknown(word))
    }

    /// The string on the wire, and in words.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Kill(reason) => reason.as_str(),
            Self::Closing(reason) => reason.as_str(),
            Self::Failure(text) | Self::Unknown(text) => text,
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// As the plain string it stands for: the wire says the same as when `reason` was a string.
impl Serialize for EventReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}
