//! What can go wrong talking to the daemon, as the library's one error type.

use std::{io, path::PathBuf};

use crate::protocol::{ClosingReason, ErrorCode};

/// What can go wrong talking to the daemon.
#[derive(Debug, thiserror::Error)]
// The io errors are part of the message and not `source`s: a report that prints the chain
// (anyhow's `{:#}`) would say them twice.
pub enum Error {
    #[error(
        "cannot connect to the leash daemon at {path}: {error} (is `leash daemon` running? \
         LEASH_SOCKET names another socket)"
    )]
    Connect { path: PathBuf, error: io::Error },
    #[error("talking to the leash daemon: {0}")]
    Io(io::Error),
    #[error("the leash daemon sent something unexpected: {0}")]
    Protocol(String),
    #[error("the leash daemon refused: {message} ({code})")]
    Daemon { code: ErrorCode, message: String },
    #[error("starting the command: {0}")]
    Spawn(io::Error),
    /// The daemon closed the connection, and so ended the lease: why, if it said (its
    /// `closing` event), and so what became of the lease's trees.
    #[error("{}", closed_message(*.0))]
    Closed(Option<ClosingReason>),
}

/// What [`Error::Closed`] says.
fn closed_message(reason: Option<ClosingReason>) -> &'static str {
    match reason {
        Some(reason) => reason.outcome(),
        None => {
            "the connection to the leash daemon closed without a reason: the daemon kills a \
             lease's trees when its connection ends, unless it handed them over"
        }
    }
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
