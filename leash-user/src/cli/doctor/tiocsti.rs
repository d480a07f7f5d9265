//! Whether the kernel lets a process push input into its terminal (ioctl TIOCSTI), so that an
//! agent sharing its user's terminal can type commands into the user's shell.

use leash::kernel::support;

use super::report::{Finding, Status};

const NAME: &str = "legacy_tiocsti";
const SYSCTL: &str = "/proc/sys/dev/tty/legacy_tiocsti";

/// The finding, from the sysctl and the kernel's version; None where the kernel has no such
/// setting and refuses TIOCSTI all the same.
pub(super) fn legacy_tiocsti_finding() -> Option<Finding> {
    finding(
        std::fs::read_to_string(SYSCTL).ok().as_deref(),
        support::version(),
    )
}

/// `sysctl`: the file's content, None if it is absent; `version`: the kernel's (major, minor).
fn finding(sysctl: Option<&str>, version: Option<(u32, u32)>) -> Option<Finding> {
    let allowed = match sysctl.map(str::trim) {
        Some("0") => {
            return Some(Finding::ok(
                NAME,
                "0: only CAP_SYS_ADMIN may push input into a terminal (TIOCSTI)",
            ));
        }
        Some(value) => format!("{value}: any process may push input into its terminal"),
        // The setting came with 6.2; before it, every kernel allows TIOCSTI.
        None if version.is_some_and(|v| v < (6, 2)) => {
            "this kernel (before 6.2) lets any process push input into its terminal".to_owned()
        }
        None => return None,
    };
    Some(
        Finding::new(
            NAME,
            Status::Warn,
            format!(
                "{allowed} (ioctl TIOCSTI): an agent that shares its user's terminal can type \
                 commands into the user's shell, which runs them outside any tree. `leash run` \
                 gives its command a pty of its own unless --no-pty; a host that starts agents \
                 itself should give them no terminal, or a pty of their own"
            ),
        )
        .with_fix("sysctl -w dev.tty.legacy_tiocsti=0 (kernel 6.2 or later)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_or_an_old_kernel_says_whether_tiocsti_is_open() {
        let status = |sysctl, version| finding(sysctl, version).map(|f| f.status);
        assert_eq!(status(Some("1\n"), Some((6, 18))), Some(Status::Warn));
        assert_eq!(status(Some("0\n"), Some((6, 18))), Some(Status::Ok));
        assert_eq!(status(None, Some((6, 1))), Some(Status::Warn));
        assert_eq!(status(None, Some((6, 2))), None);
        assert_eq!(status(None, None), None);
        let warned = finding(Some("1\n"), Some((6, 18))).unwrap();
        assert!(warned.message.contains("--no-pty"), "{}", warned.message);
        assert!(warned.fix.unwrap().contains("legacy_tiocsti=0"));
    }
}
