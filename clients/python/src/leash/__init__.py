"""leash: start AI agents whose whole process tree dies with their host.

A host connects to the leash daemon; the connection is its *lease*. Every process tree started
under the lease is killed when the host dies (SIGKILL, crash, OOM), closes the lease, or kills
the tree, whatever the agent does (new sessions, double forks, ignored signals), unless the
host released it.

    import leash, subprocess

    with leash.Lease() as lease:
        agent = lease.popen(["my-agent", "--acp"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, start_new_session=True)
        print("agent", agent.pid, "in tree", agent.tree)

For asyncio, `leash.AsyncLease` and its `create_subprocess_exec`. Standard library only.
"""

from __future__ import annotations

from ._connection import EventStream
from ._fallback import UnleashedWarning
from .aio import AsyncEventStream, AsyncLease, LeashedProcess, tree_of
from .errors import (
    ConnectionLost,
    LeaseClosed,
    LeashError,
    LimitReached,
    NotFound,
    PermissionDenied,
    Unavailable,
    Unleashed,
)
from .lease import Lease, LeashedPopen
from .protocol import Event, EventKind, KillReason, KillSummary, Member, Tree

__version__ = "0.1.0"

__all__ = [
    "AsyncEventStream",
    "AsyncLease",
    "ConnectionLost",
    "Event",
    "EventKind",
    "EventStream",
    "KillReason",
    "KillSummary",
    "Lease",
    "LeaseClosed",
    "LeashError",
    "LeashedPopen",
    "LeashedProcess",
    "LimitReached",
    "Member",
    "NotFound",
    "PermissionDenied",
    "Tree",
    "Unavailable",
    "Unleashed",
    "UnleashedWarning",
    "tree_of",
]
