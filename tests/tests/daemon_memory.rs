//! A daemon gives back what loading needed before it serves: parsing the kernel's BTF and the
//! programs' object takes some 40 MiB, freed by the time the programs are attached, which the
//! allocator keeps until asked to give it back.
//!
//! The bound cannot fail a daemon that does so: it holds ~2 MiB of its own memory then, an
//! eighth of the bound. One that does not holds ~45 MiB until its first trim, which comes up to
//! 2 s after the first connection ends (here, the one that saw its socket): read slower than
//! that, a regression may pass, but a correct daemon never fails.

use leash_tests::daemon::Daemon;

/// Memory of its own (anonymous) a daemon that has given back what loading needed stays under.
const AT_REST_KIB: u64 = 16 * 1024;

/// The daemon's anonymous resident memory (RssAnon in /proc/PID/status), in KiB, once it
/// serves (it answers a `status`: the socket is bound before the programs load): its heap and
/// stacks, not the binary's and the libraries' pages, which the kernel can drop.
fn own_memory_kib(daemon: &Daemon) -> u64 {
    let mut client = daemon.client();
    client.status().expect("the daemon's status");
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no RssAnon in the daemon's status:\n{status}"))
}

#[test]
fn a_daemon_gives_back_what_loading_needed_before_it_serves() {
    let Some(mut daemon) = Daemon::start(&[]) else {
        return;
    };
    let loaded = own_memory_kib(&daemon);
    assert!(
        loaded < AT_REST_KIB,
        "{loaded} KiB of its own once it loaded the programs; its log:\n{}",
        daemon.log()
    );
    // The other way to start: taking over the pins a previous daemon left.
    assert!(daemon.hand_over(), "the daemon did not hand over cleanly");
    daemon.restart();
    let taken_over = own_memory_kib(&daemon);
    assert!(
        taken_over < AT_REST_KIB,
        "{taken_over} KiB of its own once it took over the pins; its log:\n{}",
        daemon.log()
    );
}
