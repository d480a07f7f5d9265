//! A command that could not be executed, said and numbered as a shell does (POSIX, "Command
//! Search and Execution"): 127 when it was not found, 126 when it was found but could not be
//! executed (no execute permission, a directory, a format the kernel cannot run). `leash run`
//! and `leash exec` keep 125 for their own failures, so a caller can tell the three apart.

use std::{io, path::Path};

/// The exit status of a command that was not found.
pub(super) const NOT_FOUND: u8 = 127;
/// The exit status of a command that was found but could not be executed.
pub(super) const NOT_EXECUTABLE: u8 = 126;

/// Why `program` could not be executed, and the status to exit with.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ExecFailure {
    pub status: u8,
    /// `PROGRAM: REASON`, as a shell says it: `no-such-cmd: command not found`,
    /// `./x: Permission denied`.
    pub message: String,
}

impl ExecFailure {
    /// What exec(2) of `program` failing with `error` means (the error of an exec, always).
    pub(super) fn of_exec(program: &str, error: &io::Error) -> Self {
        let errno = error.raw_os_error();
        if errno == Some(libc::ENOENT) {
            // Without a slash the name was looked up in PATH, and found nowhere.
            let reason = if program.contains('/') {
                reason(error)
            } else {
                "command not found".to_owned()
            };
            return Self {
                status: NOT_FOUND,
                message: format!("{program}: {reason}"),
            };
        }
        // exec(2) says EACCES for a directory; a shell names it.
        let reason = if errno == Some(libc::EACCES) && program.contains('/') && is_dir(program) {
            "Is a directory".to_owned()
        } else {
            reason(error)
        };
        Self {
            status: NOT_EXECUTABLE,
            message: format!("{program}: {reason}"),
        }
    }

    /// What a failed start of `program` means, if it is exec(2)'s failure and not leash's own
    /// (no fork, no pipe, no thread: those say nothing about the command). The errnos are
    /// those that exec(2) gives and fork(2) and pipe(2) do not; ENOMEM, which both give, is
    /// taken as leash's.
    pub(super) fn of_spawn(program: &str, error: &io::Error) -> Option<Self> {
        const EXEC_ONLY: [i32; 11] = [
            libc::ENOENT,
            libc::EACCES,
            libc::EPERM,
            libc::ENOEXEC,
            libc::EISDIR,
            libc::ENOTDIR,
            libc::ELOOP,
            libc::ENAMETOOLONG,
            libc::ETXTBSY,
            libc::E2BIG,
            libc::ELIBBAD,
        ];
        let errno = error.raw_os_error()?;
        EXEC_ONLY
            .contains(&errno)
            .then(|| Self::of_exec(program, error))
    }
}

/// The system's words for `error`, without the `(os error N)` Rust adds.
fn reason(error: &io::Error) -> String {
    let text = error.to_string();
    match error.raw_os_error() {
        Some(errno) => text
            .strip_suffix(&format!(" (os error {errno})"))
            .map_or_else(|| text.clone(), str::to_owned),
        None => text,
    }
}

fn is_dir(program: &str) -> bool {
    Path::new(program).is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(errno: i32) -> io::Error {
        io::Error::from_raw_os_error(errno)
    }

    #[test]
    fn a_command_not_found_is_127() {
        assert_eq!(
            ExecFailure::of_exec("no-such-cmd", &os(libc::ENOENT)),
            ExecFailure {
                status: 127,
                message: "no-such-cmd: command not found".into()
            }
        );
        assert_eq!(
            ExecFailure::of_exec("./missing", &os(libc::ENOENT)),
            ExecFailure {
                status: 127,
                message: "./missing: No such file or directory".into()
            }
        );
    }

    #[test]
    fn a_command_that_cannot_be_executed_is_126() {
        assert_eq!(
            ExecFailure::of_exec("./x", &os(libc::EACCES)),
            ExecFailure {
                status: 126,
                message: "./x: Permission denied".into()
            }
        );
        assert_eq!(
            ExecFailure::of_exec("/", &os(libc::EACCES)).message,
            "/: Is a directory"
        );
        assert_eq!(
            ExecFailure::of_exec("./prog", &os(libc::ENOEXEC)),
            ExecFailure {
                status: 126,
                message: "./prog: Exec format error".into()
            }
        );
    }

    #[test]
    fn leash_s_own_failures_are_not_the_command_s() {
        for errno in [libc::EAGAIN, libc::ENOMEM, libc::EMFILE, libc::ECANCELED] {
            assert_eq!(ExecFailure::of_spawn("sh", &os(errno)), None, "{errno}");
        }
        assert_eq!(
            ExecFailure::of_spawn("sh", &io::Error::other("thread")),
            None
        );
        assert_eq!(
            ExecFailure::of_spawn("nope", &os(libc::ENOENT)).map(|f| f.status),
            Some(127)
        );
    }
}
