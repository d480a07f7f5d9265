//! The daemon's sockets: bound with their mode from the start, in a directory only root may
//! change, replacing only a stale socket of a daemon that died.

use std::{
    fs, io,
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::Path,
};

use anyhow::{Context, Result, bail};
use tokio::net::UnixListener;

use crate::{
    daemon::rules::config::{Config, MetricsAddr},
    sys, trusted_dir,
};

/// Removes the daemon's sockets (it is stopping, or could not start).
pub(in crate::daemon) fn remove_sockets(config: &Config) {
    let _ = fs::remove_file(&config.socket);
    if let Some(path) = config.metrics.as_ref().and_then(MetricsAddr::socket_path) {
        let _ = fs::remove_file(path);
    }
}

/// Who may connect to a socket the daemon binds, by its file's mode.
#[derive(Clone, Copy, Debug)]
pub(in crate::daemon) enum SocketAccess {
    /// 0666: anyone; what they may do is checked per request.
    Everyone,
    /// 0600, root's alone; 0660 with its group set to this one, if given.
    Root { group: Option<u32> },
}

/// Binds a socket, the one `option` names: its directory is made if needed (0755) and must be
/// root's alone (see `trusted_dir`), a stale socket is replaced, a live daemon's is not.
pub(in crate::daemon) fn bind(
    path: &Path,
    option: &str,
    access: SocketAccess,
) -> Result<UnixListener> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    refuse_shared_dir(path, dir, option)?;
    trusted_dir::ensure(dir, 0o755, option)?;
    remove_stale(path, option)?;
    // The socket is made with its mode (0777 less the mask), so its mode is never set by path
    // after it is visible, which would follow whatever the path names by then. Nothing else
    // makes files now: the daemon binds before it starts any task.
    let mask = match access {
        SocketAccess::Everyone => 0o111,
        SocketAccess::Root { group: None } => 0o177,
        SocketAccess::Root { group: Some(_) } => 0o117,
    };
    let umask = sys::umask(mask);
    let bound = UnixListener::bind(path);
    sys::umask(umask);
    let listener = bound.with_context(|| format!("binding {}", path.display()))?;
    if let SocketAccess::Root { group: Some(gid) } = access {
        // Until now the socket is 0660 root:root: no one but root could connect. The directory
        // is root's alone (checked above), so the path still names the socket just made, and
        // lchown would not follow a symlink anyway. Without CAP_CHOWN (the unit and the pod
        // bound it out), a file's owner may give it only to a group it is in.
        std::os::unix::fs::lchown(path, None, Some(gid))
            .inspect_err(|_| {
                let _ = fs::remove_file(path);
            })
            .with_context(|| {
                format!(
                    "giving {} to group {gid} (the daemon must be in the group, e.g. \
                     SupplementaryGroups= in its unit, supplementalGroups in its pod, or have \
                     CAP_CHOWN)",
                    path.display()
                )
            })?;
    }
    Ok(listener)
}

/// Refuses a socket straight in a directory that every user may write, root's and sticky
/// (/tmp, /var/tmp, /dev/shm), naming the fix that works: a directory of the socket's own in
/// it. The general advice, to make the directory root's alone, would break it for every user.
fn refuse_shared_dir(path: &Path, dir: &Path, option: &str) -> Result<()> {
    const STICKY: u32 = 0o1000;
    let Ok(meta) = fs::metadata(dir) else {
        // Missing or unreadable: the trusted-directory check says what is wrong.
        return Ok(());
    };
    let mode = meta.permissions().mode();
    if !meta.is_dir() || meta.uid() != 0 || mode & STICKY == 0 || mode & 0o022 == 0 {
        return Ok(());
    }
    let stem = path
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_default();
    // /tmp/x.sock: /tmp/leash-x/leash.sock.
    let own = if stem.is_empty() {
        dir.join("leash")
    } else if stem.starts_with("leash") {
        dir.join(stem)
    } else {
        dir.join(format!("leash-{stem}"))
    };
    let file = "leash.sock";
    bail!(
        "refusing {option} {}: {} is shared (every user may make files in it), and the \
         daemon, which runs as root, needs a directory of its own that only root can write; \
         fix: make one, mkdir -m 0755 {}, and give {option} {}",
        path.display(),
        dir.display(),
        own.display(),
        own.join(file).display()
    )
}

/// Removes a socket left by a daemon that died. Anything else at `path` (a file, a symlink)
/// is not the daemon's to remove.
fn remove_stale(path: &Path, option: &str) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        meta => meta.with_context(|| format!("checking {}", path.display()))?,
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket: the daemon replaces only a stale socket; remove it \
             if it is not needed, or choose another {option}",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another leash daemon is serving {} (choose another {option}, or stop that daemon)",
            path.display()
        );
    }
    fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))
}
