"""What a connection does with the daemon's lines, the same for threads and asyncio: a reply
goes to the request waiting for it (in any order: a `kill` is answered when its tree is empty),
an event to the streams, a `closing` event or an error sent for no request is kept as why the
daemon is about to close the connection, and a `refused` event is logged. Reading the lines,
and locking, are each connection's own."""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Protocol, Tuple

from .errors import (
    NEXT_CALL,
    ConnectionLost,
    LeaseClosed,
    LeashError,
    connection_ended,
    quote_line,
    trees_killed,
)
from .protocol import Event, ProtocolError, decode_line

log = logging.getLogger("leash")


class Settable(Protocol):
    """A request's future: concurrent.futures' or asyncio's."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class Stream(Protocol):
    def _push(self, event: Event) -> None: ...


class LineRouter:
    """`count_trees` says how many trees the lease holds on this connection: the trees the
    daemon kills if this side ends the connection."""

    def __init__(self, path: str, count_trees: Callable[[], int] = lambda: 0) -> None:
        self.path = path
        self._count_trees = count_trees
        # An error the daemon sent for no request: why it is about to close the connection.
        self._last_word: Optional[LeashError] = None
        # The reason of the daemon's `closing` event: what becomes of the lease's trees.
        self._closing_reason: Optional[str] = None
        self._closing = False

    def _streams_now(self) -> List[Stream]:
        raise NotImplementedError

    def _take_pending(self, request_id: int) -> Optional[Settable]:
        raise NotImplementedError

    def _dispatch(self, line: bytes) -> None:
        """Routes one line; raises ProtocolError (with the line) for one it cannot make out:
        the connection then ends, fail-safe."""
        decoded = decode_line(line)
        if isinstance(decoded, Event):
            if decoded.kind == "closing":
                self._closing_reason = decoded.reason or "no reason given"
            elif decoded.kind == "refused":
                log_refused(decoded)
            for stream in self._streams_now():
                stream._push(decoded)
        elif isinstance(decoded, LeashError):
            # Said when the connection closes, as the reason.
            self._last_word = decoded
        else:
            request_id, value = decoded
            future = self._take_pending(request_id)
            if future is None:
                raise ProtocolError(f"a reply to request {request_id}, which is not pending", line)
            if future.done():  # its caller was cancelled
                return
            if isinstance(value, LeashError):
                future.set_exception(value)
            else:
                future.set_result(value)

    def _end_error(
        self, detail: str, unreadable: Optional[ProtocolError] = None
    ) -> Tuple[LeashError, bool]:
        """Why the connection ended once its reader stops, and whether this side ended it.
        `detail`: what the reader saw (end of file, an error); `unreadable`: the line it
        could not make out, if that is why it stopped."""
        if self._closing:
            return LeaseClosed(), True
        if unreadable is not None:
            return unreadable_line(self.path, unreadable, self._count_trees()), False
        if self._closing_reason is None and self._last_word is not None:
            return self._last_word, False
        return connection_ended(self.path, self._closing_reason, detail), False


def unreadable_line(path: str, error: ProtocolError, trees: int) -> ConnectionLost:
    """The error for a connection this side ended on a line it could not read."""
    line = "" if error.line is None else f": {quote_line(error.line)}"
    return ConnectionLost(
        f"the leash daemon at {path} sent a line this library does not understand "
        f"({error.what}){line}. This library ended the lease on it, to be safe: "
        f"{trees_killed(trees)}; {NEXT_CALL}",
        "protocol",
    )


def log_refused(event: Event) -> None:
    """Another process sent a request on the lease's connection (it holds a copy of the
    socket), and the daemon refused it: worth a warning, not the lease's end."""
    sender = f"process {event.pid}" if event.pid else "a process this host cannot see (pid 0)"
    log.warning(
        "the leash daemon refused a request that %s sent on this lease's connection (%s): %s; "
        "the lease goes on",
        sender,
        event.code or "refused",
        event.line if event.line is not None else "(no line)",
    )
