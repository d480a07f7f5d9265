"""kill, release, adopt, trees and events of `Lease`, with a cgroup as the referee."""

from __future__ import annotations

import subprocess
import threading
from typing import Callable, List

import pytest
from conftest import Cgroup, alive, wait_until

import leash

# A chain of processes, each hop in a session of its own, each ignoring SIGTERM: what an agent
# leaves behind when it starts tools with setsid.
CHAIN = (
    'trap "" TERM; n=$1; if [ "$n" -gt 0 ]; then setsid sh -c "$0" "$0" $((n-1)) & fi; '
    "exec sleep 600"
)


def start_chain(lease: leash.Lease, cgroup: Cgroup, depth: int) -> leash.LeashedPopen:
    proc = lease.popen(cgroup.wrap(["sh", "-c", CHAIN, CHAIN, str(depth)]))
    assert wait_until(lambda: len(cgroup.procs()) == depth + 1), cgroup.procs()
    return proc


def test_kill_returns_when_the_tree_is_empty(
    lease: leash.Lease, cgroups: Callable[[str], Cgroup]
) -> None:
    cgroup = cgroups("kill")
    proc = start_chain(lease, cgroup, 5)
    summary = lease.kill(proc.leash_tree, grace=0.1)
    # No wait: kill returns once every member is gone.
    assert cgroup.procs() == set()
    assert summary.tree == proc.leash_tree
    assert summary.reason == "request"
    assert summary.terminated == 6 and summary.killed >= 1, summary
    assert proc.wait(timeout=60) == -9
    assert proc.leash_tree not in [t.tree for t in lease.trees()]


def test_kills_from_threads_are_answered_each_when_its_tree_is_empty(
    lease: leash.Lease, cgroups: Callable[[str], Cgroup]
) -> None:
    # A slow kill (a long grace, members that ignore SIGTERM) does not hold up a quick one.
    slow_group, quick_group = cgroups("slow"), cgroups("quick")
    slow = start_chain(lease, slow_group, 1)
    quick = lease.popen(quick_group.wrap(["sleep", "600"]))
    assert wait_until(lambda: len(quick_group.procs()) == 1)
    results: List[leash.KillSummary] = []
    slow_kill = threading.Thread(
        target=lambda: results.append(lease.kill(slow.leash_tree, grace=30))
    )
    slow_kill.start()
    try:
        assert wait_until(lambda: any(t.state == "killing" for t in lease.trees()))
        summary = lease.kill(quick.leash_tree, grace=0)
        assert summary.tree == quick.leash_tree
        assert quick_group.procs() == set()
        assert slow_kill.is_alive(), "the slow kill was answered before its grace ended"
        assert slow_group.procs(), "the slow tree is empty already"
    finally:
        # A second kill shortens the pending grace; both are answered once the tree is empty.
        lease.kill(slow.leash_tree, grace=0)
        slow_kill.join(60)
    assert not slow_kill.is_alive()
    assert results[0].tree == slow.leash_tree
    assert slow_group.procs() == set()
    slow.wait(timeout=60)
    quick.wait(timeout=60)


def test_a_released_tree_outlives_the_lease(cgroups: Callable[[str], Cgroup]) -> None:
    cgroup = cgroups("release")
    with leash.Lease() as lease:
        kept = lease.popen(cgroup.wrap(["sleep", "600"]))
        killed = lease.popen(["sleep", "600"])
        assert wait_until(lambda: cgroup.procs() == {kept.pid})
        lease.release(kept.leash_tree)
        assert kept.leash_tree not in [t.tree for t in lease.trees()]
    # The lease is closed (as when its host exits): the released tree runs on; the other not.
    assert killed.wait(timeout=60) < 0
    assert alive(kept.pid)
    assert cgroup.procs() == {kept.pid}
    kept.kill()  # the cgroup fixture would too
    kept.wait()


def test_adopt_a_running_process_with_its_descendants(
    lease: leash.Lease, cgroups: Callable[[str], Cgroup]
) -> None:
    cgroup = cgroups("adopt")
    running = subprocess.Popen(cgroup.wrap(["sh", "-c", "setsid sleep 600 & exec sleep 600"]))
    try:
        assert wait_until(lambda: len(cgroup.procs()) == 2)
        tree = lease.adopt(running.pid, grace=0.1)
        listed = [t for t in lease.trees() if t.tree == tree]
        assert listed and listed[0].root == running.pid and listed[0].grace_ms == 100
        assert {m.pid for m in listed[0].members} == cgroup.procs()
        lease.kill(tree)
        assert cgroup.procs() == set()
    finally:
        running.kill()
        running.wait()


def test_trees_shows_only_this_leases_trees(lease: leash.Lease) -> None:
    with leash.Lease() as other:
        mine = lease.popen(["sleep", "600"])
        theirs = other.popen(["sleep", "600"])
        assert [t.tree for t in lease.trees()] == [mine.leash_tree]
        assert [t.tree for t in other.trees()] == [theirs.leash_tree]
    assert theirs.wait(timeout=60) < 0
    mine.kill()
    mine.wait()


def test_killing_an_unknown_tree_is_not_found(lease: leash.Lease) -> None:
    with pytest.raises(leash.NotFound) as raised:
        lease.kill(4_000_000)
    assert raised.value.code == "not_found"
    assert "4000000" in raised.value.message


def test_events_follow_the_leases_trees(lease: leash.Lease) -> None:
    events = lease.events()
    with leash.Lease() as other:
        other.popen(["sleep", "600"])  # another lease's: not in this stream
        proc = lease.popen(["sh", "-c", "sleep 600 & exec sleep 600"])
        assert wait_until(lambda: [t.member_count for t in lease.trees()] == [2])
        lease.kill(proc.leash_tree, grace=0)
    seen: List[leash.Event] = []
    while not any(e.kind == "tree_empty" and e.tree == proc.leash_tree for e in seen):
        event = events.get(timeout=60)
        assert event is not None, f"no tree_empty in time; seen: {seen}"
        seen.append(event)
    assert {e.lease for e in seen} == {lease.lease_id}
    kinds = [e.kind for e in seen]
    assert kinds.index("registered") < kinds.index("kill_started") < kinds.index("tree_empty")
    assert any(e.kind == "fork" and e.parent == proc.pid for e in seen)
    empty = seen[-1]
    assert empty.kill is not None and empty.kill.reason == "request"
    events.close()
    while events.get(timeout=0) is not None:  # what was queued before the close
        pass
    assert events.ended
    proc.wait()
