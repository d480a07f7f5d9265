//! Why a request was refused: its error reply's code and message. The kernel layer's errors
//! are given their codes here, in one place.

use leash_client::protocol::{ErrorCode, ServerLine, TreeId};

use crate::kernel::{self, IdentifyError};

/// Why a request was refused: becomes the error reply.
#[derive(Debug)]
pub(in crate::daemon) struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    pub(in crate::daemon) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Trees a client may not see are reported as missing, not as forbidden.
    pub(in crate::daemon) fn no_tree(tree: TreeId) -> Self {
        Self::new(ErrorCode::NotFound, format!("no tree {tree}"))
    }

    /// The error reply to request `id`.
    pub(in crate::daemon) fn into_line(self, id: u64) -> ServerLine {
        ServerLine::error(Some(id), self.code, self.message)
    }
}

impl From<kernel::Error> for Refusal {
    fn from(error: kernel::Error) -> Self {
        Self::new(code_of(&error), error.to_string())
    }
}

impl From<IdentifyError> for Refusal {
    fn from(error: IdentifyError) -> Self {
        kernel::Error::from(error).into()
    }
}

/// The wire's code for what the kernel layer could not do.
fn code_of(error: &kernel::Error) -> ErrorCode {
    use kernel::Error as E;
    match error {
        E::Identify(
            IdentifyError::NotFound(_) | IdentifyError::Exiting(_) | IdentifyError::Gone,
        )
        | E::Exited(_)
        | E::Exiting(_)
        | E::Doomed(_)
        | E::NoTree(_) => ErrorCode::NotFound,
        E::Identify(
            IdentifyError::Thread { .. } | IdentifyError::NotPidfd | IdentifyError::Invisible,
        ) => ErrorCode::BadRequest,
        E::MembersFull(_) | E::TreesFull(_) | E::Runaway(_) => ErrorCode::LimitReached,
        E::Identify(IdentifyError::Io { .. })
        | E::StaleMember { .. }
        | E::Unfinished(_)
        | E::TreeIdsRanOut
        | E::HandBackRunaway { .. }
        | E::Reconcile(_)
        | E::TakeMember(_)
        | E::Maps(_)
        | E::Map(_) => ErrorCode::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adoption_says_why_it_failed_with_its_code() {
        let cases = [
            (kernel::Error::Exited(7), ErrorCode::NotFound),
            (kernel::Error::Doomed(3), ErrorCode::NotFound),
            (kernel::Error::MembersFull(100), ErrorCode::LimitReached),
            (kernel::Error::TreesFull(10), ErrorCode::LimitReached),
            (kernel::Error::Runaway(7), ErrorCode::LimitReached),
            (
                kernel::Error::Maps(anyhow::anyhow!("reading the map")),
                ErrorCode::Internal,
            ),
            (
                IdentifyError::Thread { tid: 8, tgid: 7 }.into(),
                ErrorCode::BadRequest,
            ),
            (IdentifyError::NotFound(9).into(), ErrorCode::NotFound),
        ];
        for (error, code) in cases {
            let message = error.to_string();
            let refusal = Refusal::from(error);
            assert_eq!(refusal.code, code, "{message}");
            assert_eq!(refusal.message, message);
        }
    }
}
