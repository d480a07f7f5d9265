//! Where the log goes: stderr as text, or, when stderr is the journal (a systemd service's),
//! journald with each event's fields as journal fields (`LEASH_EVENT`, `LEASH_TREE`, ...:
//! docs/DEPLOY.md, "Logs").

use std::{
    fs::File,
    io::IsTerminal,
    os::{fd::AsFd, unix::fs::MetadataExt},
};

use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::{EnvFilter, Layer, filter::filter_fn, layer::SubscriberExt, prelude::*};

/// The variable that picks the level (`LEASH_LOG=debug`), as `RUST_LOG` does.
const LEVEL_ENV: &str = "LEASH_LOG";
/// `LEASH_LOG_FORMAT=journald|text` forces one; otherwise the journal when stderr is it.
const FORMAT_ENV: &str = "LEASH_LOG_FORMAT";
/// Prefixed to every field of an event but its message in the journal: `tree` is `LEASH_TREE`
/// (tracing-journald uppercases the names and joins the prefix with `_`).
const JOURNAL_FIELD_PREFIX: &str = "LEASH";

/// Sets up the log for the whole process: at `default` (`info`) unless LEASH_LOG says.
pub(super) fn init(default: &'static str) {
    let filter = || EnvFilter::try_from_env(LEVEL_ENV).unwrap_or_else(|_| EnvFilter::new(default));
    let format = std::env::var(FORMAT_ENV).ok();
    let (journald, unknown_format) = match format.as_deref() {
        Some("journald") => (true, None),
        Some("text") => (false, None),
        other => (
            stderr_dev_ino().is_some_and(|(dev, ino)| {
                stderr_is_journal(std::env::var("JOURNAL_STREAM").ok().as_deref(), dev, ino)
            }),
            other.filter(|f| !f.is_empty()),
        ),
    };
    let mut unreachable = None;
    if journald {
        match tracing_journald::layer() {
            Ok(layer) => {
                let layer = layer
                    .with_field_prefix(Some(JOURNAL_FIELD_PREFIX.to_owned()))
                    .with_syslog_identifier("leash".to_owned())
                    // The journal's own levels: INFO is info (6), not notice, and DEBUG debug.
                    .with_priority_mappings(PriorityMappings {
                        info: Priority::Informational,
                        debug: Priority::Debug,
                        ..PriorityMappings::new()
                    })
                    // No span fields: each journal entry has its event's own fields, each once
                    // (a span's `tree` would be a second LEASH_TREE).
                    .with_filter(filter_fn(|metadata| !metadata.is_span()));
                tracing_subscriber::registry()
                    .with(filter())
                    .with(layer)
                    .init();
                warn_unknown(unknown_format);
                return;
            }
            Err(e) => unreachable = Some(e),
        }
    }
    tracing_subscriber::registry()
        .with(filter())
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours for a terminal; a file (or a pipe to a log collector) is grepped.
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .init();
    if let Some(e) = unreachable {
        tracing::warn!("cannot reach journald ({e}): logging to stderr as text");
    }
    warn_unknown(unknown_format);
}

fn warn_unknown(format: Option<&str>) {
    if let Some(format) = format {
        tracing::warn!("{FORMAT_ENV}={format:?} is neither journald nor text: ignored");
    }
}

/// The device and inode of stderr, if it is open.
fn stderr_dev_ino() -> Option<(u64, u64)> {
    let stderr = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let metadata = File::from(stderr).metadata().ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// Whether stderr is the journal: systemd sets `JOURNAL_STREAM` to `DEVICE:INODE` (decimal) of
/// the stream it connects a service's stdout or stderr to, and a stderr with that device and
/// inode is that stream (a variable merely inherited by a process whose stderr went elsewhere
/// does not match).
fn stderr_is_journal(journal_stream: Option<&str>, stderr_dev: u64, stderr_ino: u64) -> bool {
    journal_stream
        .and_then(|value| value.trim().split_once(':'))
        .and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)))
        .is_some_and(|stream| stream == (stderr_dev, stderr_ino))
}

#[cfg(test)]
mod tests {
    use super::stderr_is_journal;

    #[test]
    fn the_journal_is_stderr_when_the_stream_names_its_device_and_inode() {
        assert!(stderr_is_journal(Some("8:12345"), 8, 12345));
        assert!(stderr_is_journal(
            Some("64769:9876543210"),
            64769,
            9876543210
        ));
    }

    #[test]
    fn another_stream_or_none_is_not_the_journal() {
        // Inherited from a service by a process whose stderr is a file or a terminal.
        assert!(!stderr_is_journal(Some("8:12345"), 8, 12346));
        assert!(!stderr_is_journal(Some("8:12345"), 9, 12345));
        assert!(!stderr_is_journal(None, 8, 12345));
    }

    #[test]
    fn a_malformed_stream_is_not_the_journal() {
        for value in [
            "",
            ":",
            "8",
            "8:",
            ":12345",
            "x:12345",
            "8:12345:1",
            "-8:12345",
        ] {
            assert!(!stderr_is_journal(Some(value), 8, 12345), "{value:?}");
        }
    }
}
