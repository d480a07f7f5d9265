//! Reading files of /proc with no more system calls than each needs: on a machine where a
//! system call is slow, an adoption of 100k processes reads a few files of each.

use std::{
    fs::File,
    io::{self, Read},
};

use leash_common::Pid;
use procfs::FromRead;

/// The stat of process `pid`, from one read of /proc/PID/stat into `buffer`; None if it is gone
/// (or cannot be read).
pub(super) fn stat(pid: Pid, buffer: &mut Vec<u8>) -> Option<procfs::process::Stat> {
    // One line: read whole by one call, with no call more to find the end.
    read_until(&format!("/proc/{pid}/stat"), buffer, |read| {
        read.ends_with(b"\n")
    })
    .ok()?;
    procfs::process::Stat::from_read(buffer.as_slice()).ok()
}

/// Whether the file at `path` is empty, from one short read.
pub(super) fn is_empty(path: &str) -> io::Result<bool> {
    let mut file = File::open(path)?;
    let mut first = [0; 16];
    loop {
        match file.read(&mut first) {
            Ok(read) => return Ok(read == 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads the file at `path` into `buffer` (cleared first), to its end. One call reads at most
/// a page of a /proc file.
pub(super) fn read_to_end(path: &str, buffer: &mut Vec<u8>) -> io::Result<()> {
    read_until(path, buffer, |_| false)
}

/// Reads the file at `path` into `buffer` (cleared first), until its end or until `done` says
/// what was read is enough. (Not `Read::read_to_end`, which asks for the file's size and
/// position first: two system calls more per file, for a size /proc does not know.)
fn read_until(path: &str, buffer: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) -> io::Result<()> {
    const CHUNK: usize = 4096;
    buffer.clear();
    let mut file = File::open(path)?;
    loop {
        let filled = buffer.len();
        buffer.resize(filled + CHUNK, 0);
        let read = file.read(&mut buffer[filled..]);
        buffer.truncate(filled + read.as_ref().map_or(0, |&read| read));
        match read {
            Ok(0) => return Ok(()),
            Ok(_) if done(buffer) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_read_whole() {
        let mut buffer = Vec::new();
        let me = stat(std::process::id(), &mut buffer).expect("this process's stat");
        assert_eq!(me.pid as u32, std::process::id());
        assert!(buffer.ends_with(b"\n"));
        assert!(stat(u32::MAX, &mut buffer).is_none(), "no such process");
    }

    #[test]
    fn an_empty_file_is_told_from_one_that_is_not() {
        assert!(is_empty("/dev/null").unwrap());
        assert!(!is_empty("/proc/self/stat").unwrap());
        assert!(is_empty("/nonexistent").is_err());
    }

    #[test]
    fn a_file_longer_than_a_page_is_read_to_its_end() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/proc.rs");
        let mut buffer = vec![b'x'; 10];
        read_to_end(path, &mut buffer).unwrap();
        let whole = std::fs::read(path).unwrap();
        assert!(whole.len() > 4096, "a file of more than one read");
        assert_eq!(buffer, whole);
    }
}
