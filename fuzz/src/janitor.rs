//! Removes the daemon's directory (its socket) once the fuzzing process is gone, however it
//! ends: libFuzzer leaves by `exit` when its time is up, by `_Exit` on Ctrl-C, by abort on a
//! crash, and any of them may be a SIGKILL. The janitor is a child that waits for its stdin
//! to close, which happens only when the fuzzing process has exited.

use std::{
    env, fs, io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
};

pub(crate) const ROLE: &str = "janitor";
const DIR_VAR: &str = "LEASH_FUZZ_DIR";
/// The only directories a janitor removes: /tmp/leash-fuzz-*.
pub const DIR_PREFIX: &str = "/tmp/leash-fuzz-";

/// Held for as long as the directory is in use: the janitor acts when its stdin closes.
pub struct Janitor {
    _stdin: ChildStdin,
    _process: Child,
}

impl Janitor {
    pub fn start(dir: &Path) -> io::Result<Self> {
        let mut process = Command::new("/proc/self/exe")
            .env(crate::ROLE_VAR, ROLE)
            .env(DIR_VAR, dir)
            // Out of the terminal's process group: Ctrl-C must not end it before it has
            // cleaned up.
            .process_group(0)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let stdin = process.stdin.take().expect("piped");
        Ok(Self {
            _stdin: stdin,
            _process: process,
        })
    }
}

/// The janitor process: waits for the end of its stdin, then removes the directory.
pub(crate) fn serve() -> ! {
    let dir = env::var_os(DIR_VAR).map(PathBuf::from).unwrap_or_default();
    if !is_ours(&dir) {
        eprintln!(
            "leash fuzz janitor: {} is not a {DIR_PREFIX}* directory",
            dir.display()
        );
        std::process::exit(2);
    }
    let _ = io::copy(&mut io::stdin().lock(), &mut io::sink());
    let _ = fs::remove_dir_all(&dir);
    std::process::exit(0);
}

/// A directory named like the harness names its own, directly in /tmp.
pub fn is_ours(dir: &Path) -> bool {
    dir.to_str().is_some_and(|path| {
        path.strip_prefix(DIR_PREFIX)
            .is_some_and(|name| !name.is_empty() && !name.contains('/') && !name.contains(".."))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_its_own_directories() {
        assert!(is_ours(Path::new("/tmp/leash-fuzz-12-34")));
        for other in [
            "/tmp",
            "/tmp/leash-fuzz-",
            "/tmp/leash-fuzz-1/..",
            "/",
            "/tmp/x",
            "",
        ] {
            assert!(!is_ours(Path::new(other)), "{other}");
        }
    }
}
