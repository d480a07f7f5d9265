//! A child reparented to a subreaper inside the tree: the middle process exits, the grandchild
//! moves to the subreaper. Membership does not depend on the parent links.

use leash_tests::{Scenario, assert_tracks_cgroup, ppid, python, tracker};

const SUBREAPER: &str = r#"
import ctypes, subprocess, time
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
subprocess.run(["sh", "-c", "sleep 600 & exit 0"], check=True)
time.sleep(600)
"#;

#[test]
fn a_child_reparented_to_a_subreaper_stays_a_member() {
    let Some(mut tracker) = tracker!() else {
        return;
    };
    let scenario = Scenario::spawn(&mut tracker, "subreaper", &python(), &["-c", SUBREAPER]);
    let procs = scenario.cgroup.settle_exactly(&["python", "sleep"]);
    let python = scenario.root_pid();
    let orphan = *procs.iter().find(|&&p| p != python).unwrap();
    assert_eq!(
        ppid(orphan),
        Some(python),
        "the orphan should now belong to the subreaper"
    );
    let tracked = assert_tracks_cgroup(
        &tracker,
        scenario.tree,
        &scenario.cgroup,
        "reparented to a subreaper",
    );
    assert_eq!(tracked, 2);
}
