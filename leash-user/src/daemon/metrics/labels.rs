//! The label sets of the families: each a struct whose field is its label (the derive names
//! the label after the field), its value a word of the protocol or of the kernel.

use std::fmt::{self, Write as _};

use leash_client::protocol::{ErrorCode, KillReason};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

/// A protocol enum as a label value: its wire word, which its `Display` writes. A wrapper,
/// because the protocol's crate is what hosts link, and does not know prometheus-client.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Word<T>(T);

impl<T: fmt::Display> EncodeLabelValue for Word<T> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        write!(encoder, "{}", self.0)
    }
}

/// `leash_kills_total`'s.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ByReason {
    reason: Word<KillReason>,
}

impl From<KillReason> for ByReason {
    fn from(reason: KillReason) -> Self {
        Self {
            reason: Word(reason),
        }
    }
}

/// `leash_requests_refused_total`'s.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ByCode {
    code: Word<ErrorCode>,
}

impl From<ErrorCode> for ByCode {
    fn from(code: ErrorCode) -> Self {
        Self { code: Word(code) }
    }
}

/// `leash_build_info`'s.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Version {
    pub version: &'static str,
}

/// `leash_membership`'s: `kernel::Membership`'s name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Guarantee {
    pub guarantee: &'static str,
}

/// `leash_program_skips_total`'s: an attached program's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Program {
    pub program: &'static str,
}
