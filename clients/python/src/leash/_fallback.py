"""The explicit opt-in fallback (`optional=True`): with no daemon or no leash binary, commands
run unleashed. Never silently: an agent that outlives its host is what leash exists to
prevent. But once is enough: a lease says it with one `UnleashedWarning`, the first time it
finds leash unavailable, pointing at the caller's line; each command started unleashed is
then logged at INFO on the `leash` logger."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Optional

from .errors import Unavailable, Unleashed

log = logging.getLogger("leash")

# Frames in this directory are the library's own: a warning points past them.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class UnleashedWarning(UserWarning):
    """A lease runs its commands without leash (optional=True, and leash was unavailable)."""


class UnleashedNotice:
    """Says once per lease that its commands run unleashed."""

    def __init__(self) -> None:
        self._warned = False

    def say(self, reason: Unavailable, what: str) -> None:
        """`what` (e.g. "'my-agent' (pid 4242) runs") goes without leash, because of
        `reason`: logged every time (INFO), warned the first time."""
        log.info("%s UNLEASHED: %s", what, reason)
        if self._warned:
            return
        self._warned = True
        message = (
            f"leash is unavailable, so {what} UNLEASHED: if this host dies, what it started "
            "lives on. Said once for this lease; each command it starts unleashed is logged "
            f"(INFO, logger `leash`). {reason}"
        )
        warnings.warn(message, UnleashedWarning, stacklevel=_caller_stacklevel())


def _caller_stacklevel() -> int:
    """The `stacklevel` for a warnings.warn in `UnleashedNotice.say` that names the first
    frame outside this package: the caller's line (Lease(), popen, an awaited
    create_subprocess_exec...), however deep the library's own calls go."""
    level = 1
    frame = sys._getframe(1)  # say()'s
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    return level


def tree_or_unleashed(tree: Optional[int], pid: int) -> int:
    """A started command's tree; raises Unleashed for one started without leash."""
    if tree is None:
        raise Unleashed(
            f"process {pid} runs unleashed (its lease is optional=True, and leash was "
            "unavailable when it started): it has no tree. Check `proc.leash_tree is None` "
            "(or `lease.leashed`) first"
        )
    return tree
