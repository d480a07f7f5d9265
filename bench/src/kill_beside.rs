//! 2b. Kill latency by the tree's own size, alone and beside many members of other trees: a
//! kill should cost its own tree, however many others leash tracks.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use leash_client::{RootExitPolicy, TreeOptions};
use leash_tests::{Cgroup, daemon::Daemon};

use crate::{
    Plan,
    measure::{Report, f1, f2, median, median_ratio, ms},
    sections::verdict,
    trees::{PidMax, await_reaped, cgroup_kill, fan, reap, wait_ready, wait_unpopulated},
};

const GRACE_0: TreeOptions = TreeOptions {
    on_root_exit: RootExitPolicy::Kill,
    grace: Some(Duration::ZERO),
};

pub(crate) fn kill_beside_others(plan: &Plan, forker: &Path, report: &mut Report) -> Result<()> {
    let big = plan.scale;
    let others = plan.scale / 2;
    let sizes = [10, 1000, big];
    // The largest tree, the others, and the zombies of the last while init reaps them.
    let _pid_max = PidMax::at_least(big + others + big + 20_000)?;
    let baseline = leash::proc::all_processes()?.len();
    // Room in the member map for both trees (the default holds 131072 members).
    let members = (big + others + 20_000).max(leash::Capacity::default().members as usize);
    let daemon = Daemon::start(&["--max-members", &members.to_string()])
        .context("the daemon cannot start without BPF")?;
    let mut client = daemon.client();
    let mut rows = Vec::new();
    let mut met = true;
    for beside in [0, others] {
        // The other members: one tracked tree, held while these kills are timed.
        let held = (beside > 0)
            .then(|| -> Result<_> {
                let group = Cgroup::new("bench-kill-others");
                let (tree, mut root) =
                    client.spawn(&mut fan(forker, &group, beside, None), &GRACE_0)?;
                wait_ready(&mut root)?;
                Ok((group, tree, root))
            })
            .transpose()?;
        for n in sizes {
            // A large tree takes seconds to build: fewer repetitions.
            let reps = if n >= 10_000 {
                plan.kill_reps.min(3)
            } else {
                plan.kill_reps
            };
            let (mut leash, mut kernel) = (Vec::new(), Vec::new());
            for _ in 0..reps {
                let group = Cgroup::new("bench-kill-beside-leash");
                let (_tree, mut root) =
                    client.spawn(&mut fan(forker, &group, n, None), &GRACE_0)?;
                wait_ready(&mut root)?;
                let started = std::time::Instant::now();
                root.kill()?;
                wait_unpopulated(&group, Duration::from_secs(120))?;
                leash.push(ms(started.elapsed()));
                reap(root);

                let group = Cgroup::new("bench-kill-beside-cgroup");
                let mut root = fan(forker, &group, n, None).spawn()?;
                wait_ready(&mut root)?;
                kernel.push(ms(cgroup_kill(&group)?));
                reap(root);
                await_reaped(baseline + beside)?;
            }
            let ratio = median_ratio(&leash, &kernel);
            let goal = if n <= 10 { 2.0 } else { 1.1 };
            met &= ratio <= goal;
            eprintln!(
                "kill {n} beside {beside}: leash {:.1} ms, cgroup.kill {:.1} ms",
                median(&leash),
                median(&kernel)
            );
            rows.push(vec![
                n.to_string(),
                beside.to_string(),
                reps.to_string(),
                f1(median(&leash)),
                f1(median(&kernel)),
                format!("{} {}", f2(ratio), verdict(ratio <= goal)),
            ]);
        }
        if let Some((group, tree, root)) = held {
            client.kill(tree, Some(Duration::ZERO))?;
            reap(root);
            drop(group);
            await_reaped(baseline)?;
        }
    }
    report.section(
        "2b. Kill latency beside other trees",
        &format!(
            "Fans of sleeping processes (children of one small C process) in their own cgroup, \
             killed as in section 2 (leash: SIGKILL the root, grace 0; the reference: \
             cgroup.kill of the same tree, the two alternating), alone and beside one other \
             tracked tree of {others} members. pid_max is raised for the run and put back. \
             Goals: leash ≤ 2 × cgroup.kill at 10, ≤ 1.1 × at 1000 and {big}."
        ),
    );
    report.table(
        &[
            "processes",
            "other members tracked",
            "repetitions",
            "leash (ms)",
            "cgroup.kill (ms)",
            "leash / cgroup.kill",
        ],
        &rows,
    );
    report.line(&format!("Every size, alone and beside: {}.", verdict(met)));
    Ok(())
}
