//! Whole connections against the real daemon core, started once in this process: each input
//! is sent on a new connection (a line at a time, then half-closed) from an unprivileged relay
//! process, and what comes back must hold together; then the daemon must still answer `status`
//! and have ended the connection's lease and trees. See fuzz/src/harness.rs.
//!
//! In an input, `$CHILD` becomes the pid of a fresh child process of the relay and `$TREE` the
//! id of the next tree, so requests can register, list and kill real trees.
//!
//! Needs root and BPF (it loads the programs). Run it with `-detect_leaks=0`. Seeds: fuzz/corpus/connection/, made by
//! fuzz/seed-corpus.sh.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(init: {
    leash_fuzz::prepare_process();
    leash_fuzz::harness::advise_on_flags();
}, |input: &[u8]| {
    leash_fuzz::harness::run(input);
});
