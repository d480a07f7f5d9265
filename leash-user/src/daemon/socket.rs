//! The daemon's sockets: bound with their mode from the start, in a directory only root may
//! change, replacing only a stale socket of a daemon that died.

use std::{fs, io, os::unix::fs::FileTypeExt, path::Path};

use anyhow::{Context, Result, bail};
use tokio::net::UnixListener;

use super::config::{Config, MetricsAddr};
use crate::{sys, trusted_dir};

/// Removes the daemon's sockets (it is stopping, or could not start).
pub(super) fn remove_sockets(config: &Config) {
    let _ = fs::remove_file(&config.socket);
    if let Some(path) = config.metrics.as_ref().and_then(MetricsAddr::socket_path) {
        let _ = fs::remove_file(path);
    }
}

/// Who may connect to a socket the daemon binds, by its file's mode.
#[derive(Clone, Copy, Debug)]
pub(super) enum SocketAccess {
    /// 0666: anyone; what they may do is checked per request.
    Everyone,
    /// 0600, root's alone; 0660 with its group set to this one, if given.
    Root { group: Option<u32> },
}

/// Binds a socket, the one `option` names: its directory is made if needed (0755) and must be
/// root's alone (see `trusted_dir`), a stale socket is replaced, a live daemon's is not.
pub(super) fn bind(path: &Path, option: &str, access: SocketAccess) -> Result<UnixListener> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
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
