"""The exceptions of the leash host library.

Every refusal of the daemon carries its `code` and its own words (`message`), so that a host can
show the user why an agent did not start, instead of a child that exits 1.
"""

from __future__ import annotations

from typing import Optional

HOW_TO_START = (
    "start the daemon (`sudo systemctl start leash`, or `sudo leash daemon`); "
    "LEASH_SOCKET names another socket"
)


class LeashError(Exception):
    """Anything that went wrong with leash. `code` is the daemon's error code (`bad_request`,
    `not_found`, `permission_denied`, `limit_reached`, `kill_failed`, `internal`, ...), or the
    library's own (`unavailable`, `protocol`, `failed`); `message` is the daemon's words."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class Unavailable(LeashError):
    """The daemon cannot be reached (not running, restarted, handed over), or there is no
    `leash` binary to spawn through."""

    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message, code)


class PermissionDenied(LeashError):
    """The daemon refused: this host may not do that (e.g. register a process it could not
    signal itself, release a tree it does not hold)."""


class LimitReached(LeashError):
    """A per-uid limit of the daemon (trees, connections, requests a second) was reached."""


class NotFound(LeashError):
    """No such tree or process, for this client (or an unknown lease token)."""


_BY_CODE = {
    "permission_denied": PermissionDenied,
    "limit_reached": LimitReached,
    "not_found": NotFound,
}


def from_daemon(code: str, message: str) -> LeashError:
    """The exception for an error the daemon (or the exec shim) reported."""
    if code == "unavailable":
        return Unavailable(f"{message}: {HOW_TO_START}")
    return _BY_CODE.get(code, LeashError)(message, code)


def cannot_connect(socket: str, reason: Optional[BaseException]) -> Unavailable:
    why = f": {reason}" if reason is not None else ""
    return Unavailable(f"cannot connect to the leash daemon at {socket}{why}; {HOW_TO_START}")


def connection_lost(socket: str, reason: str) -> Unavailable:
    return Unavailable(
        f"lost the connection to the leash daemon at {socket} ({reason}): it stopped, restarted "
        "or handed over to a new daemon. The trees already registered stay enforced by the "
        "daemon that takes over; the next call connects again, with a new lease"
    )
