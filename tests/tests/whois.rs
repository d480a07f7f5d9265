//! The whois iterator tells the daemon what /proc does not without the right to trace a
//! process: the user namespace it runs in and who owns that (how a user's subordinate uids are
//! charged to them), and its pid namespaces (how a container's trees are told from another's).
//! Checked against the namespace links, which this test, as root, may read.

use std::{fs, time::Duration};

use leash_tests::{
    Cgroup, comm,
    daemon::{USER_A, setpriv_args},
    tracker, wait_for,
};

/// The inode number in /proc/PID/ns/KIND (`pid:[4026531836]`).
fn namespace(pid: u32, kind: &str) -> u32 {
    let link = fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
    let link = link.to_string_lossy();
    let inum = link
        .strip_prefix(&format!("{kind}:["))
        .and_then(|rest| rest.strip_suffix(']'));
    inum.and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected {link}"))
}

#[test]
fn whois_names_the_namespaces_of_a_process() {
    let Some(tracker) = tracker!() else {
        return;
    };
    let whois = tracker.whois();
    let me = std::process::id();
    let identity = whois.ask(me).unwrap().expect("this process");
    assert_eq!(
        identity.user_ns, None,
        "the test runs in the initial user namespace"
    );
    assert_eq!(&*identity.pid_namespaces, &[namespace(me, "pid")]);

    // A rootless container: uid 61001's user namespace, and a pid namespace in it.
    let cgroup = Cgroup::new("whois");
    let mut argv = setpriv_args(USER_A);
    argv.extend(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
            "sleep",
            "600",
        ]
        .map(String::from),
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut container = cgroup.command("setpriv", &argv).spawn().unwrap();
    let mut inside = None;
    let started = wait_for(Duration::from_secs(20), || {
        inside = cgroup
            .procs()
            .into_iter()
            .find(|&pid| comm(pid).as_deref() == Some("sleep"));
        inside.is_some()
    });
    assert!(started, "the container did not start: {:?}", cgroup.procs());
    let inside = inside.unwrap();
    let identity = whois.ask(inside).unwrap().expect("the container's process");
    let user_ns = identity.user_ns.expect("a user namespace of its own");
    assert_eq!(user_ns.creator_uid, USER_A, "the namespace is uid 61001's");
    assert_eq!(user_ns.inum, namespace(inside, "user"));
    assert_eq!(
        &*identity.pid_namespaces,
        &[namespace(inside, "pid"), namespace(me, "pid")],
        "its own pid namespace first, then the one above"
    );

    let _ = container.kill();
    let _ = container.wait();
    assert!(cgroup.wait_empty(Duration::from_secs(10)).is_some());
    // No process has a pid beyond pid_max.
    let pid_max: u32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(whois.ask(pid_max + 1).unwrap(), None, "no such process");
}
