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
    message = (
        f"leash is unavailable, so {what} runs UNLEASHED: its processes will outlive this "
        f"host if it dies. {reason}"
    )
    log.warning("%s", message)
    warnings.warn(message, UnleashedWarning, stacklevel=3)
