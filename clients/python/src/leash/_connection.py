"""One connection to the daemon, shared by threads: requests are sent under a lock, and a
background reader thread hands each reply to the request waiting for it (replies may come out of
order: a `kill` is answered when its tree is empty) and each event to the subscribed streams."""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional

from ._event_queue import EventQueue
from ._replies import LineRouter, Settable, Stream
from .errors import LeashError, cannot_connect
from .protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Event,
    LeaseInfo,
    ProtocolError,
    encode,
    parse_hello,
)

log = logging.getLogger("leash")

# Events a stream holds for a reader that is behind. The daemon already drops events for a
# subscriber that leaves 128 KiB unread; this bound keeps a host that never reads its stream
# from growing without end. Past it, new events are dropped and counted, and the reader gets a
# `dropped` event where they were lost, as the daemon does.
EVENT_QUEUE_CAPACITY = 10_000
# How long a request that could not be sent waits for the reader to find out why.
SEND_FAILED_READ_TIMEOUT = 5.0
# How long a spawn refused for an unknown lease token waits to see its connection lost (the
# daemon restarted), before it tries once more on a new one.
LOSS_NOTICE = 5.0


class NotSent(Exception):
    """A request was not sent: the connection was lost before (`error` says why). Nothing is
    pending at any daemon, so it may be sent again on a new connection."""

    def __init__(self, error: LeashError) -> None:
        super().__init__(str(error))
        self.error = error


class EventStream:
    """The events of a lease's trees, as they happen: iterate over it (it blocks), or `get`
    with a timeout. It ends when the lease is closed (or the stream is), and raises Unavailable
    once the events received before the connection was lost are read."""

    def __init__(
        self, wanted: Callable[[Event], bool], capacity: int = EVENT_QUEUE_CAPACITY
    ) -> None:
        self._wanted = wanted
        self._ready = threading.Condition()
        self._events = EventQueue(capacity)
        self._ended = False
        self._error: Optional[LeashError] = None
        self._on_close: Optional[Callable[[EventStream], None]] = None

    def _push(self, event: Event) -> None:
        if not (event.kind == "dropped" or self._wanted(event)):
            return
        with self._ready:
            if self._ended:
                return
            if self._events.offer(event):
                self._ready.notify_all()

    def _end(self, error: Optional[LeashError]) -> None:
        with self._ready:
            if not self._ended:
                self._ended = True
                self._error = error
            self._ready.notify_all()

    def get(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None if `timeout` seconds pass first or the stream has ended (see
        `ended`). Raises Unavailable when the connection was lost."""
        with self._ready:
            self._ready.wait_for(lambda: self._events or self._ended, timeout)
            if self._events:
                return self._events.popleft()
            if self._ended and self._error is not None:
                raise self._error
            return None

    @property
    def ended(self) -> bool:
        with self._ready:
            return self._ended and not self._events

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        event = self.get()
        if event is None:
            raise StopIteration
        return event

    def close(self) -> None:
        """Stops receiving; events already queued can still be read."""
        if self._on_close is not None:
            self._on_close(self)
        self._end(None)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Connection(LineRouter):
    """A connection and its lease. Raises Unavailable when the daemon cannot be reached.
    `count_trees`: how many trees the lease holds on it (see LineRouter)."""

    def __init__(self, path: str, count_trees: Callable[[], int] = lambda: 0) -> None:
        super().__init__(path, count_trees)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise cannot_connect(path, e) from None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: Dict[int, Future[Any]] = {}
        self._next_id = 1
        self._lost: Optional[LeashError] = None
        self._lost_event = threading.Event()
        self._streams: List[EventStream] = []
        self._subscribe_lock = threading.Lock()
        self._subscribed = False
        self._reader = threading.Thread(
            target=self._read_loop, name=f"leash-reader {path}", daemon=True
        )
        self._reader.start()
        try:
            self.lease: LeaseInfo = parse_hello(self.request("hello", protocol=PROTOCOL_VERSION))
        except NotSent as e:
            self.close()
            raise e.error from None
        except BaseException:
            self.close()
            raise

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def wait_lost(self, timeout: float) -> bool:
        """Whether the connection is found lost within `timeout` seconds."""
        return self._lost_event.wait(timeout)

    def submit(self, op: str, **fields: Any) -> Future[Any]:
        """Sends a request; the future holds its `ok` value, or raises its error. Raises
        NotSent if the connection was lost before the request could be sent."""
        future: Future[Any] = Future()
        with self._lock:
            if self._lost is not None:
                raise NotSent(self._lost)
            request_id = self._next_id
            self._next_id += 1
            self._pending[request_id] = future
        try:
            with self._send_lock:
                self._sock.sendall(encode(request_id, op, **fields))
        except OSError as e:
            # The daemon closed the connection; what it said last, if anything, is still to
            # be read: the reader tells why.
            if threading.current_thread() is not self._reader:
                self._reader.join(SEND_FAILED_READ_TIMEOUT)
            self._fail(self._end_error(f"sending: {e}")[0])
            assert self._lost is not None
            raise NotSent(self._lost) from None
        return future

    def request(self, op: str, **fields: Any) -> Any:
        return self.submit(op, **fields).result()

    def subscribe(self, stream: EventStream) -> None:
        """Adds `stream`, and subscribes the connection the first time: events from then on."""
        stream._on_close = self._remove_stream
        with self._lock:
            if self._lost is not None:
                raise NotSent(self._lost)
            self._streams.append(stream)
        with self._subscribe_lock:
            if not self._subscribed:
                try:
                    self.request("subscribe")
                except BaseException:
                    self._remove_stream(stream)
                    raise
                self._subscribed = True

    def _remove_stream(self, stream: EventStream) -> None:
        with self._lock:
            if stream in self._streams:
                self._streams.remove(stream)

    def close(self) -> None:
        """Closes the connection (which ends the lease: the daemon kills every tree of it not
        released). Pending requests raise LeashError."""
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join()
        self._sock.close()

    def _read_loop(self) -> None:
        detail = "the daemon closed the connection"
        unreadable: Optional[ProtocolError] = None
        try:
            with self._sock.makefile("rb") as lines:
                while True:
                    line = lines.readline(MAX_LINE_BYTES + 1)
                    if not line.endswith(b"\n"):
                        if len(line) > MAX_LINE_BYTES:
                            raise ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes", line)
                        break
                    self._dispatch(line)
        except ProtocolError as e:
            unreadable = e
        except OSError as e:
            detail = f"reading: {e}"
        self._fail(*self._end_error(detail, unreadable))

    def _streams_now(self) -> List[Stream]:
        with self._lock:
            return list(self._streams)

    def _take_pending(self, request_id: int) -> Optional[Settable]:
        with self._lock:
            return self._pending.pop(request_id, None)

    def _fail(self, error: LeashError, ended_by_us: bool = False) -> None:
        with self._lock:
            if self._lost is None:
                self._lost = error
            pending, self._pending = self._pending, {}
            streams, self._streams = self._streams, []
        self._lost_event.set()
        if not ended_by_us:
            log.warning("%s", error)
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        for stream in streams:
            stream._end(None if ended_by_us else error)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
