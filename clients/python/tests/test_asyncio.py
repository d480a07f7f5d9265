"""`AsyncLease`: create_subprocess_exec and _shell as asyncio's own, kill, release and events;
and the asyncio ACP host of examples/acp_host.py, run as an unprivileged user, whose stubborn
agent (it ignores SIGTERM and stdin's end, and starts a tool with setsid) dies with it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, List, Optional

import pytest
from conftest import SYSTEM_PYTHON, Cgroup, Lines, user_env, wait_until

import leash


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_create_subprocess_exec_is_asyncios_with_a_tree() -> None:
    async def host() -> None:
        async with leash.AsyncLease() as lease:
            proc = await lease.create_subprocess_exec(
                "sh",
                "-c",
                'read line; echo "out:$line:$$"; echo err >&2; exit 3',
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert isinstance(proc, asyncio.subprocess.Process)
            assert isinstance(proc, leash.LeashedProcess)
            tree = proc.tree
            assert leash.tree_of(proc) == tree and proc.leash_tree == tree
            listed = [t for t in await lease.trees() if t.tree == tree]
            assert listed and listed[0].root == proc.pid
            out, err = await proc.communicate(b"hi\n")
            assert (out, err, proc.returncode) == (f"out:hi:{proc.pid}\n".encode(), b"err\n", 3)

    run(host())


def test_create_subprocess_shell_cwd_env_and_new_session(tmp_path: Path) -> None:
    async def host() -> None:
        async with leash.AsyncLease() as lease:
            proc = await lease.create_subprocess_shell(
                'echo "$WHERE $(pwd) $(ps -o sid= -p $$)" $$',
                stdout=asyncio.subprocess.PIPE,
                cwd=tmp_path,
                env={"WHERE": "here", "PATH": os.environ["PATH"]},
                start_new_session=True,
            )
            out, _ = await proc.communicate()
            where, cwd, sid, pid = out.decode().split()
            assert (where, cwd) == ("here", str(tmp_path))
            assert int(sid) == int(pid) == proc.pid
            assert proc.returncode == 0

    run(host())


def test_a_missing_program_raises_file_not_found() -> None:
    async def host() -> None:
        async with leash.AsyncLease() as lease:
            with pytest.raises(FileNotFoundError) as raised:
                await lease.create_subprocess_exec("no-such-program-leash-test")
            assert raised.value.filename == "no-such-program-leash-test"

    run(host())


def test_kill_release_and_events(cgroups: Callable[[str], Cgroup]) -> None:
    killed_group, kept_group = cgroups("async-kill"), cgroups("async-kept")

    async def host() -> Optional[int]:
        async with leash.AsyncLease(grace=0.2) as lease:
            events = await lease.events()
            doomed = await lease.create_subprocess_exec(
                *killed_group.wrap(["sh", "-c", 'trap "" TERM; setsid sleep 600 & sleep 600'])
            )
            kept = await lease.create_subprocess_exec(*kept_group.wrap(["sleep", "600"]))
            assert wait_until(lambda: len(killed_group.procs()) == 3)
            assert wait_until(lambda: kept_group.procs() == {kept.pid})
            summary = await lease.kill(doomed.tree)
            assert killed_group.procs() == set(), "kill returned before the tree was empty"
            assert summary.terminated == 3 and summary.killed >= 1, summary
            assert summary.reason == "request"
            # SIGKILLed (-9), or it saw the sleep it waits for SIGKILLed first (128 + 9).
            assert await doomed.wait() in (-9, 128 + 9)
            seen: List[leash.Event] = []
            async for event in events:
                seen.append(event)
                if event.kind == "tree_empty":
                    break
            assert seen[-1].tree == doomed.tree
            await lease.release(kept.tree)
            return kept.pid

    kept_pid = run(host())
    # The lease is closed; the released tree runs on.
    assert kept_group.procs() == {kept_pid}


def test_events_subscribe_when_first_read() -> None:
    async def host() -> None:
        async with leash.AsyncLease() as lease:
            events = lease.events()
            assert await events.get(timeout=0) is None  # read once: subscribed from now on
            proc = await lease.create_subprocess_exec("true")
            async for event in events:
                if event.kind == "tree_empty" and event.tree == leash.tree_of(proc):
                    assert event.kill is not None and event.kill.reason == "root_exited"
                    break
            assert await proc.wait() == 0

    run(host())


def test_optional_falls_back_with_one_warning(tmp_path: Path) -> None:
    async def host() -> None:
        with pytest.warns(leash.UnleashedWarning, match="UNLEASHED") as warned:
            lease = await leash.AsyncLease.connect(
                socket=str(tmp_path / "none.sock"), optional=True
            )
            assert not lease.leashed
            procs = [await lease.create_subprocess_exec("true") for _ in range(2)]
        # (Other warnings may come meanwhile: an earlier test's transport collected now.)
        unleashed = [w for w in warned if issubclass(w.category, leash.UnleashedWarning)]
        assert len(unleashed) == 1, [str(w.message) for w in unleashed]
        assert unleashed[0].filename == __file__
        for proc in procs:
            assert leash.tree_of(proc) is None and proc.leash_tree is None
            with pytest.raises(leash.Unleashed, match=f"process {proc.pid} runs unleashed"):
                _ = proc.tree
            assert await proc.wait() == 0
        await lease.aclose()
        with pytest.raises(leash.Unavailable, match="sudo systemctl start leash"):
            await leash.AsyncLease.connect(socket=str(tmp_path / "none.sock"))

    run(host())


def beats(path: Path) -> List[float]:
    try:
        return [float(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


def start_acp_host(
    cgroup: Cgroup, for_anyone: Path, user_dir: Path, test_user: int, mode: str
) -> subprocess.Popen:  # type: ignore[type-arg]
    """examples/acp_host.py as the unprivileged user, in `cgroup`, with the stubborn agent."""
    argv = [
        SYSTEM_PYTHON, "-s", str(for_anyone / "examples" / "acp_host.py"), "--grace", "0.3",
        "--", SYSTEM_PYTHON, "-s", str(for_anyone / "agents" / "stubborn_agent.py"),
        str(user_dir), mode,
    ]  # fmt: skip
    return subprocess.Popen(
        cgroup.wrap(argv, uid=test_user),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=user_env(for_anyone, user_dir),
        cwd=user_dir,
    )


def test_a_sigkilled_acp_host_takes_its_stubborn_agent_and_its_setsid_tool_along(
    cgroups: Callable[[str], Cgroup], for_anyone: Path, user_dir: Path, test_user: int
) -> None:
    cgroup = cgroups("acp-host-killed")
    agent_beat, tool_beat = user_dir / "agent.beat", user_dir / "tool.beat"
    with start_acp_host(cgroup, for_anyone, user_dir, test_user, "hang") as host:
        try:
            assert host.stdout is not None
            lines = Lines(host.stdout)
            lines.until(lambda line: "on leash tree" in line)
            lines.until(lambda line: "tool_call" in line and "in_progress" in line)
            # Both are at work: the agent (in a session of its own) and its setsid tool.
            assert wait_until(lambda: len(beats(agent_beat)) >= 3 and len(beats(tool_beat)) >= 3)
            # The agent, its tool, and the tool's `sleep` now and then.
            members = cgroup.procs() - {host.pid}
            assert len(members) >= 2, f"the agent and its tool are not both there: {members}"

            killed_at = time.time()
            host.kill()
            assert host.wait(timeout=60) == -9
            assert cgroup.wait_empty(), f"left running after the host's death: {cgroup.procs()}"
            emptied_at = time.time()
            sizes = (agent_beat.stat().st_size, tool_beat.stat().st_size)
        finally:
            host.kill()
            host.wait()
    # Nothing is left to write: the heartbeats stopped when the tree was killed.
    agent_last, tool_last = beats(agent_beat)[-1], beats(tool_beat)[-1]
    assert agent_last <= emptied_at and tool_last <= emptied_at
    print(
        f"ACP host SIGKILLed: tree empty {emptied_at - killed_at:.3f} s later (grace 0.3 s); "
        f"last heartbeats {agent_last - killed_at:+.3f} s (agent), {tool_last - killed_at:+.3f} s "
        "(setsid tool) from the kill"
    )
    assert (agent_beat.stat().st_size, tool_beat.stat().st_size) == sizes


def test_an_acp_host_that_exits_leaves_nothing_behind(
    cgroups: Callable[[str], Cgroup], for_anyone: Path, user_dir: Path, test_user: int
) -> None:
    cgroup = cgroups("acp-host-exits")
    with start_acp_host(cgroup, for_anyone, user_dir, test_user, "answer") as host:
        try:
            assert host.stdout is not None
            lines = Lines(host.stdout)
            lines.until(lambda line: "prompt answered: end_turn" in line)
            done = lines.until(lambda line: line.startswith("host: done"))
            assert done == "host: done, agent exit status -9", done
            assert host.wait(timeout=60) == 0
            # The host closed its lease before it exited: the agent and its setsid tool died.
            assert cgroup.procs() == set()
        finally:
            host.kill()
            host.wait()
