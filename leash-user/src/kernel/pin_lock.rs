//! The pin directory's lock: one daemon per pin directory. Two daemons on the same pins would
//! each take the other's trees for their own (the second takes them over, and kills them when
//! it stops), so the one that comes second is refused before it reads or removes anything.
//!
//! The lock is flock(2) on the pin root directory itself (bpffs holds no regular files), taken
//! for the life of its holder. The kernel drops it when the holder exits or is SIGKILLed, which
//! is what makes a hand-over and a take-over work: the old daemon gives it up by exiting, never
//! earlier (a closing daemon may still be killing trees), and the next one takes it.

use std::{
    fmt,
    fs::{File, TryLockError},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use leash_common::Pid;

/// The lock on one pin directory, held until this is dropped (or the process ends).
#[derive(Debug)]
pub struct PinLock {
    /// The directory, open (close-on-exec, so nothing this process runs inherits the lock).
    _dir: File,
}

impl PinLock {
    /// Takes the lock on `root`, an existing directory, without waiting. `Ok(None)` when
    /// `root` went away meanwhile (a daemon that stopped removes it as it ends): make it again
    /// and retry. A live holder's refusal is a [`PinsHeld`] error.
    pub fn take(root: &Path) -> Result<Option<Self>> {
        Self::lock(open_dir(root)?, root)
    }

    /// Locks `dir`, opened from `root`, if `root` still names it.
    fn lock(dir: File, root: &Path) -> Result<Option<Self>> {
        match dir.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(PinsHeld {
                    root: root.to_path_buf(),
                    holder: Holder::of(&dir),
                }
                .into());
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", root.display()));
            }
        }
        // The lock is on what was opened: if that directory was removed (or replaced) before
        // the lock was taken, it guards nothing.
        let opened = dir.metadata().context("reading the locked directory")?;
        let now = std::fs::metadata(root).ok();
        let same = now.is_some_and(|now| now.dev() == opened.dev() && now.ino() == opened.ino());
        Ok(same.then_some(Self { _dir: dir }))
    }
}

/// `root`, opened to be locked (close-on-exec, as std opens everything).
fn open_dir(root: &Path) -> Result<File> {
    File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(root)
        .with_context(|| format!("opening the pin directory {}", root.display()))
}

/// Another process holds a pin directory's lock: a live daemon on the same pins.
#[derive(Debug)]
pub struct PinsHeld {
    pub root: PathBuf,
    /// Who holds it, as far as /proc tells.
    pub holder: Option<Holder>,
}

impl std::error::Error for PinsHeld {}

impl fmt::Display for PinsHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let root = self.root.display();
        match &self.holder {
            Some(holder) => write!(
                f,
                "another leash daemon ({holder}) holds the pins in {root}"
            )?,
            None => write!(
                f,
                "another process holds the pins in {root} (one this daemon cannot see: another \
                 pid namespace?)"
            )?,
        }
        write!(
            f,
            ": two daemons on the same pins would each take the other's trees. Stop that daemon \
             first (its trees are killed; SIGHUP hands them over instead), or give this one pins \
             of its own: --pin-dir DIR (another directory on bpffs), or --no-pin (its trees then \
             die with it)"
        )
    }
}

/// The process that holds a lock, and the sockets it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: Pid,
    /// Its command line, space-separated.
    pub command: String,
    /// The paths of the Unix sockets it listens on (its `--socket` among them).
    pub sockets: Vec<PathBuf>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if !self.command.is_empty() {
            write!(f, ", `{}`", self.command)?;
        }
        for socket in &self.sockets {
            write!(f, ", socket {}", socket.display())?;
        }
        Ok(())
    }
}

impl Holder {
    /// Who holds the flock on `file`, from /proc/locks; None where the holder is not visible
    /// from here.
    fn of(file: &File) -> Option<Self> {
        let meta = file.metadata().ok()?;
        let locks = procfs::locks().ok()?;
        let pid = locks.iter().find_map(|lock| {
            let on_file = lock.lock_type == procfs::LockType::FLock
                && lock.devmaj == libc::major(meta.dev())
                && lock.devmin == libc::minor(meta.dev())
                && lock.inode == meta.ino();
            on_file
                .then_some(lock.pid)
                .flatten()
                .and_then(|pid| Pid::try_from(pid).ok())
                .filter(|&pid| pid > 0)
        })?;
        let process = procfs::process::Process::new(pid as i32).ok()?;
        let command = process.cmdline().unwrap_or_default().join(" ");
        Some(Self {
            pid,
            command,
            sockets: listening_sockets(&process),
        })
    }
}

/// The paths of the Unix sockets `process` listens on: its socket descriptors that its own
/// network namespace lists unconnected with a path (an accepted connection shows its listener's
/// path too, but connected).
fn listening_sockets(process: &procfs::process::Process) -> Vec<PathBuf> {
    use procfs::process::FDTarget;
    let Ok(fds) = process.fd() else {
        return Vec::new();
    };
    let inodes: std::collections::HashSet<u64> = fds
        .flatten()
        .filter_map(|fd| match fd.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect();
    let Ok(entries) = process.unix() else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .into_iter()
        .filter(|entry| {
            entry.state == procfs::net::UnixState::UNCONNECTED && inodes.contains(&entry.inode)
        })
        .filter_map(|entry| entry.path)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A directory of its own under /tmp, removed at the end.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let path = std::env::temp_dir().join(format!("leash-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_its_socket() {
        let dir = TempDir::new("pin-lock");
        let socket = dir.0.join("s");
        let _listener = UnixListener::bind(&socket).unwrap();
        let held = PinLock::take(&dir.0)
            .unwrap()
            .expect("the directory is there");
        // Another open file description, as another daemon's: flock conflicts across them.
        let refused = PinLock::take(&dir.0).unwrap_err();
        let held_by = refused
            .downcast_ref::<PinsHeld>()
            .expect("a PinsHeld error");
        let holder = held_by.holder.as_ref().expect("this process is visible");
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.sockets, vec![socket.clone()]);
        let text = refused.to_string();
        for part in [
            &format!("pid {}", std::process::id()),
            "--pin-dir",
            "--no-pin",
        ] {
            assert!(text.contains(part), "{text}");
        }
        assert!(text.contains(&socket.display().to_string()), "{text}");
        drop(held);
        assert!(
            PinLock::take(&dir.0).unwrap().is_some(),
            "free once dropped"
        );
    }

    #[test]
    fn a_lock_on_a_directory_removed_meanwhile_is_not_taken() {
        let dir = TempDir::new("pin-lock-gone");
        let root = dir.0.join("root");
        std::fs::create_dir(&root).unwrap();
        let opened = open_dir(&root).unwrap();
        // A stopping daemon removes the directory; the next makes it again.
        std::fs::remove_dir(&root).unwrap();
        std::fs::create_dir(&root).unwrap();
        assert!(PinLock::lock(opened, &root).unwrap().is_none());
        assert!(
            PinLock::take(&root).unwrap().is_some(),
            "the new one is locked"
        );
        std::fs::remove_dir(&root).unwrap();
        assert!(
            PinLock::take(&root).is_err(),
            "no directory: an error, not a lock"
        );
    }
}
