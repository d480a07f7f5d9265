//! A host's kill of its tree reports the whole tree: the members of the trees nested in it
//! (an agent that runs `leash run` or registers its own children moves them there) are counted
//! in its summary, not left out as if the agent's processes were gone already.

use std::time::Duration;

use leash_client::TreeOptions;
use leash_tests::{
    daemon::{Daemon, LeashedTree, path_str},
    leash_binary,
};

#[test]
fn the_kill_summary_counts_the_nested_trees_members() {
    let Some(daemon) = Daemon::start(&[]) else {
        return;
    };
    let mut host = daemon.client();
    // The agent puts its tool on a leash of its own: `sleep` is in a tree nested in the host's.
    let script = r#""$0" --socket "$1" run -- sleep 600 & wait"#;
    let binary = leash_binary();
    let tree = LeashedTree::spawn(
        &mut host,
        "kill-nested",
        "sh",
        &["-c", script, path_str(&binary), path_str(&daemon.socket)],
        &TreeOptions::default(),
    );
    let members = tree.cgroup.settle_exactly(&["sh", "leash", "sleep"]);
    let nested = host
        .list()
        .unwrap()
        .into_iter()
        .filter(|t| t.nested_in == Some(tree.tree))
        .count();
    assert_eq!(nested, 1, "leash run's tree is nested in the host's");

    let summary = host.kill(tree.tree, Some(Duration::from_secs(5))).unwrap();
    eprintln!("killed {} processes: {summary:?}", members.len());
    assert_eq!(
        summary.terminated,
        members.len() as u64,
        "every process of the tree, the nested tree's sleep included, was sent SIGTERM"
    );
    assert!(tree.cgroup.wait_empty(Duration::from_secs(10)).is_some());
}
