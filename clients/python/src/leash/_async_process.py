"""The processes an `AsyncLease` starts: `LeashedProcess`, `tree_of`, and how the shim that
starts each is read and reaped without blocking the event loop."""

from __future__ import annotations

import asyncio
import os
from asyncio.subprocess import Process
from typing import Any, List, Optional, Tuple, cast

from . import _shim
from ._fallback import tree_or_unleashed


class LeashedProcess(Process):
    """An asyncio.subprocess.Process started by an AsyncLease: `pid` is the command's own and
    `tree` its tree. `leash_tree` is the tree or None, for a command started unleashed
    (`optional=True`, and leash was unavailable)."""

    leash_tree: Optional[int] = None

    @property
    def tree(self) -> int:
        """The command's tree; raises leash.Unleashed if it was started unleashed."""
        return tree_or_unleashed(self.leash_tree, self.pid)


def leashed(proc: Process, tree: Optional[int]) -> LeashedProcess:
    """`proc`, as the LeashedProcess it is. asyncio makes the Process itself (and its
    transport and protocol with it), so the class is set on the object it made: a subclass
    with no state of its own beside `leash_tree`, so nothing else changes."""
    proc.__class__ = LeashedProcess
    leashed = cast(LeashedProcess, proc)
    leashed.leash_tree = tree
    return leashed


def tree_of(process: Any) -> Optional[int]:
    """The leash tree of a process a lease started, or None (it runs unleashed, or no lease
    started it). `process.tree` is the tree, or raises Unleashed."""
    tree = getattr(process, "leash_tree", None)
    return tree if isinstance(tree, int) else None


async def read_to_end(fd: int) -> bytes:
    """What the shim writes on its status descriptor, up to its end of file, without blocking
    the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    done: asyncio.Future[bytes] = loop.create_future()
    chunks: List[bytes] = []

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError as e:
            if not done.done():
                done.set_exception(e)
            return
        if not chunk:
            if not done.done():
                done.set_result(b"".join(chunks))
            return
        chunks.append(chunk)
        if sum(map(len, chunks)) > _shim.MAX_STATUS_BYTES and not done.done():
            done.set_exception(OSError(f"more than {_shim.MAX_STATUS_BYTES} bytes of status"))

    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


async def reap(proc: Process, read_stderr: bool) -> Tuple[Optional[int], Optional[bytes]]:
    """Waits for a shim that did not run its command; returns its exit status and, if asked
    and its stderr is a pipe of ours, what it said there."""
    stderr = None
    if proc.stdin is not None:
        proc.stdin.close()
    if read_stderr and proc.stderr is not None:
        stderr = await proc.stderr.read(_shim.MAX_STATUS_BYTES)
    return await proc.wait(), stderr
