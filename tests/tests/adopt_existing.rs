//! Registering a root that already has 20 descendants (5 chains of 4): they are found in /proc,
//! and what forks afterwards joins in the kernel.

use std::{io::Write, process::Stdio};

use leash_tests::{CHAIN, Cgroup, assert_tracks_cgroup, tracker};

#[test]
fn a_root_with_twenty_descendants_is_adopted_whole() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let cgroup = Cgroup::new("adopt");
    // Five chains of four, then wait for a line on stdin, then fork five more sleeps.
    let script = r#"for i in 1 2 3 4 5; do sh -c "$0" "$0" 3 & done; read line; for i in 1 2 3 4 5; do sleep 600 & done; exec sleep 600"#;
    let mut command = cgroup.command("sh", &["-c", script, CHAIN]);
    command.stdin(Stdio::piped());
    let mut root = command.spawn().unwrap();
    let guard = ReapOnDrop(&mut root);
    cgroup.settle(21, &["sleep", "sh"]);
    // settle() accepts the root's `sh`; the chains themselves must be all sleep by now.
    let tree = tracker.adopt(guard.0.id()).expect("adopting");
    assert_eq!(tracker.tree_status(tree).unwrap().seeded, 21);
    assert_eq!(
        assert_tracks_cgroup(
            &tracker,
            tree,
            &cgroup,
            "adopted with 20 existing descendants"
        ),
        21
    );

    guard.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    cgroup.settle(26, &["sleep"]);
    assert_eq!(
        assert_tracks_cgroup(&tracker, tree, &cgroup, "adopted, then 5 more forks"),
        26
    );
    assert_eq!(tracker.tree_status(tree).unwrap().joined, 5);
    drop(guard);
}

struct ReapOnDrop<'a>(&'a mut std::process::Child);

impl Drop for ReapOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
