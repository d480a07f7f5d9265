//! A host holding 1 GiB, SIGKILLed: its kill begins at the signal (`host_killed`), while the
//! kernel has yet to tear its memory down (some 100 ms here) before its socket closes and its
//! pidfd turns readable. host_death has the other ways a host dies or lives on; this one is
//! apart because its size costs a minute under emulation, where the guests run the same kernel
//! path with the smaller hosts of host_death.

use leash_tests::{Cgroup, daemon::Daemon};

use super::host_death::{Host, WAIT, await_dead, awaited_lease_end};

#[test]
fn a_host_holding_a_gibibyte_is_seen_dying_at_its_sigkill() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let cgroup = Cgroup::new("host-memory");
    let mut host = Host::start(&daemon, &cgroup, &["memory", "1024"]);
    host.process.kill().unwrap();
    let _ = host.process.wait();
    await_dead(host.agent, "agent");
    assert!(
        cgroup.wait_empty(WAIT).is_some(),
        "the cgroup did not empty"
    );
    assert_eq!(awaited_lease_end(&daemon, host.pid()), "host_killed");
}
