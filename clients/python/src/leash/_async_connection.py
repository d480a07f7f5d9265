"""The asyncio connection to the daemon: an `AsyncLease`'s requests, and a task of its own that
reads the replies and events."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Dict, List, Optional

from ._async_events import AsyncEventStream
from ._connection import SEND_FAILED_READ_TIMEOUT, NotSent
from ._replies import LineRouter, Settable, Stream
from .errors import LeaseClosed, LeashError, cannot_connect
from .protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    LeaseInfo,
    ProtocolError,
    encode,
    parse_hello,
)

log = logging.getLogger("leash")


class AsyncConnection(LineRouter):
    """A connection and its lease, read by a task that hands each reply to its request (out of
    order: a `kill` is answered when its tree is empty) and each event to the streams."""

    def __init__(
        self,
        path: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        count_trees: Callable[[], int],
    ) -> None:
        super().__init__(path, count_trees)
        self._reader = reader
        self._writer = writer
        self._send_lock = asyncio.Lock()
        self._pending: Dict[int, asyncio.Future[Any]] = {}
        self._next_id = 1
        self._lost: Optional[LeashError] = None
        self._streams: List[AsyncEventStream] = []
        self._subscribed: Optional[asyncio.Future[None]] = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        self.lease = LeaseInfo(0, "")

    @classmethod
    async def open(cls, path: str, count_trees: Callable[[], int]) -> AsyncConnection:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=MAX_LINE_BYTES)
        except OSError as e:
            raise cannot_connect(path, e) from None
        connection = cls(path, reader, writer, count_trees)
        try:
            connection.lease = parse_hello(
                await connection.request("hello", protocol=PROTOCOL_VERSION)
            )
        except NotSent as e:
            await connection.close()
            raise e.error from None
        except BaseException:
            await connection.close()
            raise
        return connection

    @property
    def lost(self) -> bool:
        return self._lost is not None

    async def wait_lost(self, timeout: float) -> bool:
        """Whether the connection is found lost within `timeout` seconds."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except asyncio.TimeoutError:
            pass
        return self._lost is not None

    async def submit(self, op: str, **fields: Any) -> asyncio.Future[Any]:
        """Sends a request; the future holds its `ok` value, or raises its error. Raises
        NotSent if the connection was lost before the request could be sent."""
        if self._lost is not None:
            raise NotSent(self._lost)
        request_id = self._next_id
        self._next_id += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            async with self._send_lock:
                self._writer.write(encode(request_id, op, **fields))
                await self._writer.drain()
        except (OSError, RuntimeError) as e:
            # The daemon closed the connection; what it said last, if anything, is still to
            # be read: the reader tells why.
            await self.wait_lost(SEND_FAILED_READ_TIMEOUT)
            self._fail(self._end_error(f"sending: {e}")[0])
            assert self._lost is not None
            raise NotSent(self._lost) from None
        return future

    async def request(self, op: str, **fields: Any) -> Any:
        return await (await self.submit(op, **fields))

    async def subscribe(self, stream: AsyncEventStream) -> None:
        stream._on_close = self._remove_stream
        if self._lost is not None:
            raise NotSent(self._lost)
        self._streams.append(stream)
        try:
            if self._subscribed is None:
                self._subscribed = await self.submit("subscribe")
            await asyncio.shield(self._subscribed)
        except BaseException:
            self._remove_stream(stream)
            raise

    def _remove_stream(self, stream: AsyncEventStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)

    async def close(self) -> None:
        self._closing = True
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, RuntimeError):
            pass
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _read_loop(self) -> None:
        detail = "the daemon closed the connection"
        unreadable: Optional[ProtocolError] = None
        try:
            while True:
                try:
                    line = await self._reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError:
                    raise ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes") from None
                self._dispatch(line)
        except ProtocolError as e:
            unreadable = e
        except (OSError, RuntimeError) as e:
            detail = f"reading: {e}"
        except asyncio.CancelledError:
            # The event loop is shutting down with the lease open: the process is ending,
            # and the daemon ends the lease with it.
            self._fail(
                LeaseClosed("the event loop stopped: this lease is closed"), ended_by_us=True
            )
            raise
        self._fail(*self._end_error(detail, unreadable))

    def _streams_now(self) -> List[Stream]:
        return list(self._streams)

    def _take_pending(self, request_id: int) -> Optional[Settable]:
        return self._pending.pop(request_id, None)

    def _fail(self, error: LeashError, ended_by_us: bool = False) -> None:
        if self._lost is None:
            self._lost = error
            if not ended_by_us:
                log.warning("%s", error)
        pending, self._pending = self._pending, {}
        streams, self._streams = self._streams, []
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
                # Retrieved or not, it is said in the log: no "never retrieved" noise.
                future.exception()
        for stream in streams:
            stream._end(None if ended_by_us else error)
        if not self._writer.is_closing():
            self._writer.close()
