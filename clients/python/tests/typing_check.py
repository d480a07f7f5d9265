"""What a user's code gets from the library under `mypy --strict` (`cargo xtask lint` checks
this file; it is never run). Each `# type: ignore[...]` marks a line that must be a type
error: mypy's warn_unused_ignores (on under --strict) fails if it is not."""

from __future__ import annotations

import asyncio
import subprocess
from typing import IO, TYPE_CHECKING, Optional

import leash

if TYPE_CHECKING:
    from typing_extensions import assert_type


def threads() -> None:
    with leash.Lease(grace=2.5) as lease:
        # Text or bytes, as subprocess.Popen's overloads say.
        text = lease.popen(["my-agent"], stdout=subprocess.PIPE, text=True)
        assert_type(text, leash.LeashedPopen[str])
        assert_type(text.stdout, Optional[IO[str]])
        raw = lease.popen(["my-agent"], stdin=subprocess.PIPE, start_new_session=True)
        assert_type(raw, leash.LeashedPopen[bytes])
        encoded = lease.popen("my-agent --acp", shell=True, encoding="utf-8")
        assert_type(encoded, leash.LeashedPopen[str])
        # The tree, never None (raises leash.Unleashed for a command started unleashed);
        # leash_tree stays, Optional.
        assert_type(text.tree, int)
        assert_type(text.leash_tree, Optional[int])
        summary = lease.kill(raw.tree, grace=0.5)
        assert_type(summary.elapsed_ms, int)
        assert_type(lease.trees()[0].grace, float)
        # Every keyword is Popen's own: a typo is an error.
        lease.popen(["my-agent"], stdot=subprocess.PIPE)  # type: ignore[call-overload]
        lease.popen(["my-agent"], grace="2s")  # type: ignore[call-overload]
        # The tree may be None: not a tree to kill.
        lease.kill(raw.leash_tree)  # type: ignore[arg-type]


async def asyncio_host() -> None:
    async with leash.AsyncLease(grace=1.0) as lease:
        agent = await lease.create_subprocess_exec(
            "my-agent", "--acp", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert_type(agent, leash.LeashedProcess)
        assert_type(agent.tree, int)
        assert_type(agent.leash_tree, Optional[int])
        assert_type(agent.stdout, Optional[asyncio.StreamReader])
        await lease.kill(agent.tree)
        shell = await lease.create_subprocess_shell("my-agent --acp", start_new_session=True)
        assert_type(shell, leash.LeashedProcess)
        # asyncio's keywords only, and its pipes are bytes.
        await lease.create_subprocess_exec("my-agent", stdot=asyncio.subprocess.PIPE)  # type: ignore[call-arg]
        await lease.create_subprocess_exec("my-agent", text=True)  # type: ignore[arg-type]


def errors() -> None:
    try:
        leash.Lease()
    except leash.ConnectionLost as lost:
        assert_type(lost.reason, Optional[str])
    except leash.LeaseClosed as closed:
        assert_type(closed.code, str)
