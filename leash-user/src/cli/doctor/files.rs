//! The files the daemon needs: bpffs and its mode, the socket's directory (checked as the
//! daemon checks it), and the pins (complete, of this leash's ABI).

use std::{
    fs,
    io::{self, ErrorKind},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use leash::kernel::Pins;
use leash_common::ABI_VERSION;

use super::{
    bounds::NEEDS_ROOT_FIX,
    report::{Finding, Status},
};

/// Where bpffs is mounted by convention, and the daemon's default pin directory.
const BPFFS: &str = "/sys/fs/bpf";
pub(super) const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/leash";

/// bpffs at /sys/fs/bpf (as /proc/self/mountinfo says), and its mode.
pub(super) fn bpffs() -> Finding {
    const NAME: &str = "bpffs";
    let mountinfo = match fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => text,
        Err(e) => {
            return Finding::new(
                NAME,
                Status::Warn,
                format!("reading /proc/self/mountinfo: {e}"),
            );
        }
    };
    let mounted = mountinfo.lines().any(|line| {
        let Some((mount, filesystem)) = line.split_once(" - ") else {
            return false;
        };
        mount.split(' ').nth(4) == Some(BPFFS) && filesystem.split(' ').next() == Some("bpf")
    });
    if !mounted {
        return Finding::new(
            NAME,
            Status::Fail,
            format!(
                "no BPF file system is mounted at {BPFFS}: the daemon pins its programs and \
                 maps there, so that tracking goes on while it is away"
            ),
        )
        .with_fix(format!(
            "mount -t bpf -o mode=0700 bpf {BPFFS} (as root; the daemon mounts it itself if it \
             may, and `leash daemon --no-pin` needs none, but then tracking ends with the daemon)"
        ));
    }
    let meta = match fs::metadata(BPFFS) {
        Ok(meta) => meta,
        Err(e) => return Finding::new(NAME, Status::Warn, format!("mounted, but {BPFFS}: {e}")),
    };
    let mode = meta.mode() & 0o7777;
    if meta.uid() != 0 {
        Finding::new(
            NAME,
            Status::Fail,
            format!(
                "mounted at {BPFFS}, but owned by uid {} (mode {mode:04o}): the daemon trusts \
                 only root's directories for its pins",
                meta.uid()
            ),
        )
        .with_fix(format!("chown root {BPFFS} && chmod 0700 {BPFFS}"))
    } else if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        Finding::new(
            NAME,
            Status::Fail,
            format!(
                "mounted at {BPFFS}, mode {mode:04o}: others may write it, and replace the pins"
            ),
        )
        .with_fix(format!("chmod 0700 {BPFFS}"))
    } else if mode & 0o022 != 0 {
        Finding::new(
            NAME,
            Status::Warn,
            format!(
                "mounted at {BPFFS}, mode {mode:04o}: any user may make the pin directory \
                 before the daemon does, and the daemon then refuses to use it"
            ),
        )
        .with_fix(format!("chmod 0700 {BPFFS}"))
    } else {
        Finding::ok(NAME, format!("mounted at {BPFFS}, mode {mode:04o}, root's"))
    }
}

/// The socket's directory, checked as the daemon checks it before it binds (trusted_dir).
pub(super) fn socket_dir(socket: &Path) -> Finding {
    const NAME: &str = "socket_dir";
    let dir = socket
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Err(e) = leash::trusted_dir::check_existing(dir, "--socket") {
        let denied = e
            .chain()
            .filter_map(|cause| cause.downcast_ref::<io::Error>())
            .any(|e| e.kind() == ErrorKind::PermissionDenied);
        if denied {
            return Finding::new(
                NAME,
                Status::NeedsRoot,
                format!("needs root to check {}: {e:#}", dir.display()),
            )
            .with_fix(NEEDS_ROOT_FIX);
        }
        // The error ends with its fix ("...; fix: choose another --socket ..., or ... chown
        // root DIR && chmod go-w DIR"): they go apart.
        let message = format!("{e:#}");
        return match message.split_once("; fix: ") {
            Some((what, fix)) => Finding::new(NAME, Status::Fail, what).with_fix(fix),
            None => Finding::new(NAME, Status::Fail, message)
                .with_fix("choose another --socket, in a directory of root's alone"),
        };
    }
    let d = dir.display();
    match fs::metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => Finding::ok(
            NAME,
            format!(
                "{d} does not exist yet; the daemon makes it (0755), and what is above it is root's alone"
            ),
        ),
        Err(e) => Finding::new(NAME, Status::Warn, format!("{d}: {e}")),
        Ok(meta) if meta.mode() & 0o001 == 0 => Finding::new(
            NAME,
            Status::Warn,
            format!(
                "{d} (mode {:04o}) is root's alone, but other users cannot reach the socket in it",
                meta.mode() & 0o7777
            ),
        )
        .with_fix(format!(
            "chmod 0755 {d}, if other users' hosts should use leash"
        )),
        Ok(meta) => Finding::ok(
            NAME,
            format!(
                "{d}: root's, mode {:04o}, as the daemon requires",
                meta.mode() & 0o7777
            ),
        ),
    }
}

/// The pins: where the daemon says it pinned (or, without a daemon, the default pin
/// directory), complete, of this leash's ABI, and no other ABI's beside them.
pub(super) fn pins(pinned_at: Option<Option<String>>, pin_dir: &Path, root: bool) -> Finding {
    const NAME: &str = "pins";
    let (dir, daemon_up) = match pinned_at {
        Some(None) => {
            return Finding::new(
                NAME,
                Status::Warn,
                "the daemon does not pin (--no-pin): if it dies, tracking ends with it, and no \
                 daemon can take its trees over",
            )
            .with_fix(format!("run the daemon without --no-pin (pins go to --pin-dir, {DEFAULT_PIN_DIR} by default)"));
        }
        Some(Some(dir)) => (PathBuf::from(dir), true),
        None => (pin_dir.join(format!("v{ABI_VERSION}")), false),
    };
    let root_dir = dir.parent().unwrap_or(Path::new("/")).to_owned();
    // Whether the pins can be looked at: bpffs is usually root's alone.
    if let Err(e) = fs::read_dir(&root_dir)
        && e.kind() == ErrorKind::PermissionDenied
    {
        if root {
            return Finding::new(
                NAME,
                Status::Fail,
                format!("root may not read {}: {e}", root_dir.display()),
            )
            .with_fix("look for a security module (SELinux, AppArmor) that denies it");
        }
        return Finding::new(
            NAME,
            Status::NeedsRoot,
            format!(
                "needs root to look at the pins in {} (root's alone)",
                root_dir.display()
            ),
        )
        .with_fix(NEEDS_ROOT_FIX);
    }
    let pins = Pins::existing(&root_dir);
    let others = pins.other_versions();
    let others_text = others
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let d = dir.display();
    if daemon_up {
        if !dir.ends_with(format!("v{ABI_VERSION}")) {
            return Finding::new(
                NAME,
                Status::Warn,
                format!("the daemon pins at {d}, not of this leash's ABI (v{ABI_VERSION}): it is another release"),
            )
            .with_fix("run one release of leash for the daemon and its clients (see docs/DEPLOY.md)");
        }
        let missing = pins.missing();
        if !missing.is_empty() {
            return Finding::new(
                NAME,
                Status::Fail,
                format!(
                    "the daemon pins at {d}, but {} of its pins are missing ({}): a daemon \
                     that takes over from it will not find them",
                    missing.len(),
                    missing[0].display()
                ),
            )
            .with_fix("restart the daemon (systemctl restart leash: it kills every tree) to pin them again");
        }
    } else if pins.exist() {
        return Finding::new(
            NAME,
            Status::Warn,
            format!(
                "pins at {d} with no daemon answering: the programs go on tracking every tree, \
                 but nothing kills a tree until a daemon takes them over"
            ),
        )
        .with_fix("start the daemon (systemctl start leash, or leash daemon): it takes them over");
    }
    if !others.is_empty() {
        return Finding::new(
            NAME,
            Status::Warn,
            format!(
                "pins of another leash release beside these (ABI v{ABI_VERSION}): {others_text}; \
                 their programs follow their trees, but no daemon of this release enforces them"
            ),
        )
        .with_fix(format!(
            "stop the daemon of that release (its trees are killed), or once its trees are \
             gone, remove them: rm -r {others_text}"
        ));
    }
    if daemon_up {
        Finding::ok(
            NAME,
            format!("{d}: every link and map pinned, ABI v{ABI_VERSION}"),
        )
    } else {
        Finding::ok(NAME, format!("none left at {d} (ABI v{ABI_VERSION})"))
    }
}
