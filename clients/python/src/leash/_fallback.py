"""The explicit opt-in fallback (`optional=True`): with no daemon or no leash binary, commands
run unleashed, and every time that happens it is said, as a warning and in the log. Never
silently: an agent that outlives its host is what leash exists to prevent."""

from __future__ import annotations

import logging
import warnings

from .errors import Unavailable

log = logging.getLogger("leash")


class UnleashedWarning(UserWarning):
    """A command was started without leash (optional=True, and leash was unavailable)."""


def warn_unleashed(reason: Unavailable, what: str) -> None:
    """Says that `what` (e.g. "'my-agent' (pid 4242) runs") goes without leash, and why."""
    message = (
        f"leash is unavailable, so {what} UNLEASHED: if this host dies, what it started lives "
        f"on. {reason}"
    )
    log.warning("%s", message)
    warnings.warn(message, UnleashedWarning, stacklevel=3)
