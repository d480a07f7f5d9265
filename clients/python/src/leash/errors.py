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
# The most of a line from the daemon an error quotes.
QUOTED_LINE_BYTES = 200
# Written when the lease itself was still usable: how it goes on.
NEXT_CALL = "the next call connects again, with a new lease"


class LeashError(Exception):
    """Anything that went wrong with leash. `code` is the daemon's error code (`bad_request`,
    `not_found`, `permission_denied`, `limit_reached`, `kill_failed`, `internal`, ...), or the
    library's own (`unavailable`, `protocol`, `closed`, `unleashed`, `failed`); `message` is
    the daemon's words."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


class Unavailable(LeashError):
    """The daemon cannot be reached (not running, stopped, restarted, handed over), or there
    is no `leash` binary to spawn through."""

    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message, code)


class ConnectionLost(Unavailable):
    """The connection to the daemon ended while the lease used it. `reason` is what the daemon
    said as it closed the connection: `shutdown` (it stopped and killed this lease's trees),
    `hand_over` (it stopped and left the trees to the next daemon, which enforces them), or
    `not_reading` (this host left too many replies unread: the lease ended and its trees were
    killed); None when it said nothing (the message then says what the daemon does). The next
    call connects again, with a new lease."""

    def __init__(self, message: str, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.reason = reason


class LeaseClosed(LeashError):
    """The lease was closed (`close()`, `aclose()`, or its event loop stopped): it starts and
    holds nothing more. Open a new one."""

    def __init__(self, message: str = "this lease is closed: open a new one") -> None:
        super().__init__(message, "closed")


class Unleashed(LeashError):
    """A process was asked for its tree, but it runs without one: it was started unleashed
    (`optional=True`, and leash was unavailable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "unleashed")


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


def connection_ended(socket: str, closing: Optional[str], detail: str) -> ConnectionLost:
    """Why a connection the daemon closed (or that broke) ended, and what became of the
    lease's trees: `closing` is the reason the daemon gave in its `closing` event, if it sent
    one; `detail` is what this side saw (end of file, a read or write error)."""
    if closing == "shutdown":
        what = (
            f"the leash daemon at {socket} stopped (shutdown): it killed this lease's trees. "
            f"{NEXT_CALL.capitalize()} once a daemon runs"
        )
    elif closing == "hand_over":
        what = (
            f"the leash daemon at {socket} handed its trees over to the next daemon: they stay "
            f"enforced (held for as long as this process lives); {NEXT_CALL}"
        )
    elif closing == "not_reading":
        what = (
            f"the leash daemon at {socket} closed the connection (not_reading): this host left "
            "more than 128 KiB of replies and events unread, so the lease ended and the daemon "
            f"killed its trees; {NEXT_CALL}"
        )
    elif closing is not None:
        what = (
            f"the leash daemon at {socket} closed the connection ({closing}, a reason this "
            "library does not know): the daemon kills a lease's trees when its connection "
            f"ends, unless it handed them over to a new daemon; {NEXT_CALL}"
        )
    else:
        what = (
            f"the connection to the leash daemon at {socket} closed without a reason "
            f"({detail}): the daemon kills a lease's trees when its connection ends, unless it "
            f"handed them over to a new daemon; {NEXT_CALL}"
        )
    return ConnectionLost(what, closing)


def quote_line(line: bytes) -> str:
    """A line from the daemon, as an error shows it: at most its first 200 bytes."""
    shown = line.rstrip(b"\n")
    cut = shown[:QUOTED_LINE_BYTES]
    return repr(cut) + (f" (the first {QUOTED_LINE_BYTES} bytes)" if len(shown) > len(cut) else "")


def trees_killed(count: int) -> str:
    """What the daemon does with the trees of a lease this side ended."""
    trees = "1 tree" if count == 1 else f"{count} trees"
    return f"the daemon kills this lease's {trees}, since the lease ended"
