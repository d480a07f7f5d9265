//! A few descriptors kept for enforcement. A kill opens a pidfd per member it signals, and reads
//! /proc; a daemon whose table is full (clients' load, a leak) would put the signals off to a
//! later round. The daemon holds [`keep_reserve`] descriptors (eventfds, which cost nothing
//! else) from its start; a kill's open that fails for want of a descriptor gives them back and
//! tries again at once, and the reserve is taken up again once the kill step is done
//! ([`refill_reserve`]). Only enforcement draws on it, so no client's load can use it up.

use std::{
    io,
    os::fd::OwnedFd,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicUsize, Ordering},
    },
};

static HELD: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
/// How many the reserve holds when full (0: no reserve, in anything but the daemon).
static SIZE: AtomicUsize = AtomicUsize::new(0);

fn held() -> MutexGuard<'static, Vec<OwnedFd>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// Keeps `size` descriptors in reserve from now on.
pub fn keep_reserve(size: usize) -> io::Result<()> {
    SIZE.store(size, Ordering::Relaxed);
    fill()
}

/// Runs `call`; if it fails for want of a descriptor (EMFILE, ENFILE), gives the reserve back
/// and runs it again.
pub fn with_reserve<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    match call() {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            let given_back = std::mem::take(&mut *held());
            if given_back.is_empty() {
                return Err(e);
            }
            drop(given_back);
            call()
        }
        done => done,
    }
}

/// Takes the reserve up again, as far as descriptors can be had now (the rest next time).
pub fn refill_reserve() {
    let _ = fill();
}

/// Opens descriptors until the reserve is full, or one cannot be had.
fn fill() -> io::Result<()> {
    let size = SIZE.load(Ordering::Relaxed);
    let mut held = held();
    while held.len() < size {
        held.push(rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC,
        )?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_short_of_descriptors_is_given_the_reserve() {
        keep_reserve(4).unwrap();
        let emfile = || io::Error::from_raw_os_error(libc::EMFILE);
        let mut tries = 0;
        let opened = with_reserve(|| {
            tries += 1;
            if tries == 1 { Err(emfile()) } else { Ok(()) }
        });
        assert!(
            opened.is_ok() && tries == 2,
            "tried again once the reserve was given back"
        );
        assert!(held().is_empty());
        assert_eq!(
            with_reserve(|| Err::<(), _>(emfile())).map_err(|e| e.raw_os_error()),
            Err(Some(libc::EMFILE)),
            "nothing left to give: the shortage is the answer"
        );
        let mut tries = 0;
        let _ = with_reserve(|| {
            tries += 1;
            Err::<(), _>(io::Error::from_raw_os_error(libc::ESRCH))
        });
        assert_eq!(tries, 1, "only a shortage of descriptors draws on it");
        refill_reserve();
        assert_eq!(held().len(), 4);
    }
}
