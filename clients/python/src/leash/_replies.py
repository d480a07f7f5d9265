"""What a connection does with the daemon's lines, the same for threads and asyncio: a reply
goes to the request waiting for it (in any order: a `kill` is answered when its tree is empty),
an event to the streams, and an error sent for no request is kept as why the daemon is about to
close the connection. Reading the lines, and locking, are each connection's own."""

from __future__ import annotations

from typing import Any, List, Optional, Protocol, Tuple

from .errors import LeashError, connection_lost
from .protocol import Event, ProtocolError, decode_line


class Settable(Protocol):
    """A request's future: concurrent.futures' or asyncio's."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException) -> None: ...


class Stream(Protocol):
    def _push(self, event: Event) -> None: ...


class LineRouter:
    def __init__(self, path: str) -> None:
        self.path = path
        # An error the daemon sent for no request: why it is about to close the connection.
        self._last_word: Optional[LeashError] = None
        self._closing = False

    def _streams_now(self) -> List[Stream]:
        raise NotImplementedError

    def _take_pending(self, request_id: int) -> Optional[Settable]:
        raise NotImplementedError

    def _dispatch(self, line: bytes) -> None:
        decoded = decode_line(line)
        if isinstance(decoded, Event):
            for stream in self._streams_now():
                stream._push(decoded)
        elif isinstance(decoded, LeashError):
            # Said when the connection closes, as the reason.
            self._last_word = decoded
        else:
            request_id, value = decoded
            future = self._take_pending(request_id)
            if future is None:
                raise ProtocolError(f"a reply to request {request_id}, which is not pending")
            if future.done():  # its caller was cancelled
                return
            if isinstance(value, LeashError):
                future.set_exception(value)
            else:
                future.set_result(value)

    def _end_error(self, reason: str) -> Tuple[LeashError, bool]:
        """Why the connection ended once its reader stops (`reason`: what the reader saw), and
        whether this side ended it."""
        if self._closing:
            return LeashError("the lease is closed", "closed"), True
        if self._last_word is not None:
            return self._last_word, False
        return connection_lost(self.path, reason), False
