//! Directories the daemon trusts: where it binds its socket and pins its programs. The daemon
//! runs as root, so whoever can write such a directory, or one above it, can stand in for it:
//! swap the socket for one of their own (answering other users' hosts), swap a path the
//! daemon then changes, or hide the pins a hand-over needs. Each directory and every existing
//! ancestor must be owned by root and writable by no one else. An ancestor with the sticky
//! bit (/tmp, a bpffs root) may be writable by all: nobody but root can rename or remove
//! root's entries in it. What someone else could have made first in it is checked like the
//! rest.
//!
//! The walk goes down from `/` one component at a time, with lstat: a symlink where leash's
//! own directory belongs is refused. A symlink higher up (/var/run) must be root's, in a
//! trusted directory, and lead to a trusted directory. Missing components are made here with
//! the given mode and checked as they are made.

use std::{
    fs,
    io::ErrorKind,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Component, Path, PathBuf},
};

use anyhow::{Context, Result, bail};

const ROOT: u32 = 0;
/// Write permission for the group and for others.
const GO_WRITE: u32 = 0o022;
const STICKY: u32 = 0o1000;

/// Makes `dir` (and any missing parent) with `mode` if needed, and checks that it and every
/// ancestor can be trusted, or says exactly what to fix. `option` names the command-line
/// option that chose `dir`, for the error.
pub(crate) fn ensure(dir: &Path, mode: u32, option: &str) -> Result<()> {
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    walk(&dir, Some(mode), option, 0, true)
}

/// The check [`ensure`] makes, with nothing made: whether the daemon would trust `dir` (as
/// leash's own directory) and every ancestor, or what to fix. A missing part is fine if what
/// exists above it is trusted: the daemon makes it. For `leash doctor`, as any user (a
/// directory this user may not search above `dir` is an error, saying so).
pub fn check_existing(dir: &Path, option: &str) -> Result<()> {
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    walk(&dir, Some(0o755), option, 0, false)
}

/// How a directory is used, which decides what is trusted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Above the directories leash uses: a sticky one may be writable by all.
    Ancestor,
    /// Leash's own, or made by it: nobody else may write it.
    Own,
}

/// Checks `path` from `/` down. `create`: the mode to make missing components with; None
/// when `path` is a symlink's target, which must exist and is all ancestors. `make_missing`:
/// false to stop at the first missing component instead (what is below it would be made, and trusted).
fn walk(
    path: &Path,
    create: Option<u32>,
    option: &str,
    depth: u8,
    make_missing: bool,
) -> Result<()> {
    let mut names = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => names.push(name),
            Component::ParentDir | Component::Prefix(_) => bail!(
                "{} has a `..`: give the {option} path without one",
                path.display()
            ),
        }
    }
    let own = |i: usize| create.is_some() && i + 1 == names.len();
    let mut at = PathBuf::from("/");
    let role = if names.is_empty() && create.is_some() {
        Role::Own
    } else {
        Role::Ancestor
    };
    check(&at, &lstat(&at)?, role, option)?;
    // Once a component had to be made, every one below is leash's own.
    let mut made = false;
    for (i, name) in names.iter().enumerate() {
        let next = at.join(name);
        let role = if own(i) || made {
            Role::Own
        } else {
            Role::Ancestor
        };
        let meta = match (fs::symlink_metadata(&next), create) {
            (Err(e), Some(_)) if e.kind() == ErrorKind::NotFound && !make_missing => return Ok(()),
            (Err(e), Some(mode)) if e.kind() == ErrorKind::NotFound => {
                made = true;
                make(&next, mode)?;
                check(&next, &lstat(&next)?, Role::Own, option)?;
                at = next;
                continue;
            }
            (meta, _) => meta.with_context(|| format!("checking {}", next.display()))?,
        };
        // Leash's own directory is never a symlink (check refuses it), nor is anything on the
        // path a symlink leads to, which canonicalize resolved (one there now is a race).
        if meta.file_type().is_symlink() && role == Role::Ancestor && depth == 0 {
            if meta.uid() != ROOT {
                bail!(
                    "refusing {}: it is a symlink owned by uid {}, who chooses where it leads; \
                     choose another {option}",
                    next.display(),
                    meta.uid()
                );
            }
            // Its directory was checked, so only root can change the link; where it leads
            // must be trusted all the way down too.
            let target = fs::canonicalize(&next)
                .with_context(|| format!("following the symlink {}", next.display()))?;
            walk(&target, None, option, depth + 1, make_missing)?;
            at = target;
            continue;
        }
        check(&next, &meta, role, option)?;
        at = next;
    }
    Ok(())
}

fn lstat(path: &Path) -> Result<fs::Metadata> {
    fs::symlink_metadata(path).with_context(|| format!("checking {}", path.display()))
}

/// Makes the directory `path` with exactly `mode` (the umask may have taken bits away). The
/// mode is set through a descriptor opened without following a symlink, never by path.
fn make(path: &Path, mode: u32) -> Result<()> {
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        // Made meanwhile by someone else: the check that follows judges it.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
    }
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
        .and_then(|dir| dir.set_permissions(fs::Permissions::from_mode(mode)))
        .with_context(|| format!("setting the mode of {} to {mode:o}", path.display()))
}

/// Whether the directory `path` (lstat: `meta`) can be trusted in `role`; if not, what to fix.
fn check(path: &Path, meta: &fs::Metadata, role: Role, option: &str) -> Result<()> {
    let p = path.display();
    if meta.file_type().is_symlink() {
        bail!(
            "refusing {p}: it is a symlink, where the daemon needs a real directory owned by \
             root; choose another {option}, or give the path it leads to"
        );
    }
    if !meta.is_dir() {
        bail!("refusing {p}: it is not a directory; choose another {option}");
    }
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    let writable = mode & GO_WRITE != 0;
    let sticky = mode & STICKY != 0;
    let sticky_ancestor = role == Role::Ancestor && sticky;
    if role == Role::Own && uid == ROOT && writable && sticky {
        // Shared by every user (/tmp): making it root's alone would break it for them.
        bail!(
            "refusing {p} (mode {mode:04o}): it is shared (every user may make files in it), \
             and the daemon, which runs as root, needs a directory of its own that only root \
             can write; fix: make one in it, mkdir -m 0755 {p}/leash, and choose the {option} \
             path there"
        );
    }
    if uid != ROOT || (writable && !sticky_ancestor) {
        bail!(
            "refusing {p} (owner uid {uid}, mode {mode:04o}): the daemon runs as root and \
             trusts it, so it must be owned by root and writable by no one else; fix: choose \
             another {option} in a directory of its own that only root can write (under /run, \
             say), or, if {p} is meant for leash alone, chown root {p} && chmod go-w {p}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{chown, symlink};

    use super::*;

    /// Someone else: no passwd entry is needed.
    const USER: u32 = 61001;

    /// A directory of the test's own under /tmp (root's, 1777), removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        /// None, after saying so, when not root: the check trusts only root's directories.
        fn new(label: &str) -> Option<Self> {
            if fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(ROOT) {
                eprintln!("skipped: the directories made here must be root's; run as root");
                return None;
            }
            let path = PathBuf::from(format!(
                "/tmp/leash-trusted-dir-{}-{label}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir(&path).unwrap();
            set_mode(&path, 0o755);
            Some(Self(path))
        }

        /// A directory `name` in it with `mode`, owned by `uid`.
        fn dir(&self, name: &str, mode: u32, uid: u32) -> PathBuf {
            let path = self.0.join(name);
            fs::create_dir_all(&path).unwrap();
            set_mode(&path, mode);
            chown(&path, Some(uid), Some(uid)).unwrap();
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn set_mode(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn refused(dir: &Path) -> String {
        let error = ensure(dir, 0o755, "--socket").expect_err("refused");
        format!("{error:#}")
    }

    #[test]
    fn makes_missing_directories_with_the_mode() {
        let Some(scratch) = Scratch::new("makes") else {
            return;
        };
        let dir = scratch.0.join("a/b");
        ensure(&dir, 0o700, "--pin-dir").unwrap();
        assert_eq!(mode(&scratch.0.join("a")), 0o700);
        assert_eq!(mode(&dir), 0o700);
        // Again: nothing to make, all trusted.
        ensure(&dir, 0o700, "--pin-dir").unwrap();
    }

    #[test]
    fn accepts_roots_directories_below_a_sticky_one() {
        let Some(scratch) = Scratch::new("sticky") else {
            return;
        };
        let sticky = scratch.dir("shared", 0o1777, ROOT);
        let dir = scratch.dir("shared/leash", 0o755, ROOT);
        ensure(&dir, 0o755, "--socket").unwrap();
        ensure(&sticky.join("made"), 0o755, "--socket").unwrap();
        // Leash's own directory may not be the sticky one: anyone could make its socket. The
        // fix is a directory of its own there, not to take the shared one from its users.
        let error = refused(&sticky);
        assert!(error.contains("mode 1777"), "{error}");
        assert!(
            error.contains(&format!("mkdir -m 0755 {}/leash", sticky.display())),
            "{error}"
        );
        assert!(!error.contains("chmod go-w"), "{error}");
    }

    #[test]
    fn refuses_another_users_directory() {
        let Some(scratch) = Scratch::new("user") else {
            return;
        };
        let dir = scratch.dir("theirs", 0o755, USER);
        let error = refused(&dir);
        let p = dir.display();
        assert!(error.contains(&format!("refusing {p} (owner uid {USER}, mode 0755)")));
        assert!(
            error.contains("choose another --socket in a directory of its own"),
            "{error}"
        );
        assert!(
            error.contains(&format!("chown root {p} && chmod go-w {p}")),
            "{error}"
        );
        // Nor anything below it, made or not.
        assert!(refused(&dir.join("below")).contains(&format!("refusing {p} ")));
        assert!(!dir.join("below").exists(), "nothing is made below it");
    }

    #[test]
    fn refuses_a_directory_others_may_write() {
        let Some(scratch) = Scratch::new("writable") else {
            return;
        };
        for (name, bits) in [("group", 0o775), ("others", 0o757), ("all", 0o777)] {
            let dir = scratch.dir(name, bits, ROOT);
            let error = refused(&dir);
            assert!(error.contains(&format!("mode {bits:04o}")), "{error}");
            // Not sticky: not even as an ancestor.
            refused(&scratch.dir(&format!("{name}/leash"), 0o755, ROOT));
        }
        let sticky_users = scratch.dir("sticky-users", 0o1777, USER);
        refused(&scratch.dir("sticky-users/leash", 0o755, ROOT));
        refused(&sticky_users);
    }

    #[test]
    fn refuses_symlinks_it_cannot_trust() {
        let Some(scratch) = Scratch::new("symlinks") else {
            return;
        };
        let good = scratch.dir("good", 0o755, ROOT);
        let link = scratch.0.join("link");
        symlink(&good, &link).unwrap();
        // As leash's own directory: never, wherever it leads.
        assert!(refused(&link).contains("symlink"));
        // Higher up: root's link to a trusted directory is fine (/var/run -> /run).
        ensure(&link.join("leash"), 0o755, "--socket").unwrap();
        assert!(good.join("leash").is_dir());
        // Someone else's link is not, nor root's to an untrusted place.
        let theirs = scratch.0.join("theirs");
        symlink(&good, &theirs).unwrap();
        std::os::unix::fs::lchown(&theirs, Some(USER), Some(USER)).unwrap();
        assert!(refused(&theirs.join("leash")).contains(&format!("owned by uid {USER}")));
        let bad = scratch.dir("bad", 0o777, ROOT);
        let to_bad = scratch.0.join("to-bad");
        symlink(&bad, &to_bad).unwrap();
        assert!(refused(&to_bad.join("leash")).contains(&format!("refusing {}", bad.display())));
    }

    #[test]
    fn checks_without_making_anything() {
        let Some(scratch) = Scratch::new("check") else {
            return;
        };
        let missing = scratch.0.join("a/b");
        check_existing(&missing, "--socket").unwrap();
        assert!(!scratch.0.join("a").exists(), "nothing is made");
        let open = scratch.dir("open", 0o777, ROOT);
        let error = format!("{:#}", check_existing(&open, "--socket").unwrap_err());
        assert!(error.contains("mode 0777"), "{error}");
        assert!(check_existing(&open.join("below"), "--socket").is_err());
        let theirs = scratch.dir("theirs", 0o755, USER);
        assert!(check_existing(&theirs, "--socket").is_err());
    }

    #[test]
    fn refuses_files_and_dot_dots() {
        let Some(scratch) = Scratch::new("files") else {
            return;
        };
        let file = scratch.0.join("file");
        fs::write(&file, "").unwrap();
        assert!(refused(&file).contains("not a directory"));
        assert!(refused(&scratch.0.join("x/../y")).contains("`..`"));
    }
}
