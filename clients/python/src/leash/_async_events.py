"""`AsyncEventStream`: the events of an `AsyncLease`'s trees, queued for asyncio readers. The
connection pushes into it; the lease says which events are its own."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Generator, Optional

from ._connection import EVENT_QUEUE_CAPACITY
from ._event_queue import EventQueue
from .errors import LeashError
from .protocol import Event


class AsyncEventStream:
    """The events of a lease's trees, as they happen: `async for event in stream`, or `await
    stream.get(timeout)`. It subscribes when first read, or when awaited (`stream = await
    lease.events()`: events from then on). It ends when the lease is closed (or the stream
    is), and raises Unavailable once the events received before the connection was lost are
    read."""

    def __init__(
        self,
        subscribe: Callable[[AsyncEventStream], Awaitable[None]],
        capacity: int = EVENT_QUEUE_CAPACITY,
    ) -> None:
        self._subscribe: Optional[Callable[[AsyncEventStream], Awaitable[None]]] = subscribe
        self._wanted: Callable[[Event], bool] = lambda event: False
        self._events = EventQueue(capacity)
        # Made once a loop runs it (an asyncio.Event of Python 3.9 binds to a loop when made).
        self._changed: Optional[asyncio.Event] = None
        self._ended = False
        self._error: Optional[LeashError] = None
        self._on_close: Optional[Callable[[AsyncEventStream], None]] = None

    def _push(self, event: Event) -> None:
        if self._ended or not (event.kind == "dropped" or self._wanted(event)):
            return
        if self._events.offer(event) and self._changed is not None:
            self._changed.set()

    def _end(self, error: Optional[LeashError]) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
        if self._changed is not None:
            self._changed.set()

    async def _subscribed(self) -> AsyncEventStream:
        if self._changed is None:
            self._changed = asyncio.Event()
        subscribe, self._subscribe = self._subscribe, None
        if subscribe is not None:
            try:
                await subscribe(self)
            except LeashError as e:
                self._end(e)  # every later read says it too
                raise
        return self

    def __await__(self) -> Generator[Any, None, AsyncEventStream]:
        return self._subscribed().__await__()

    async def get(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None if `timeout` seconds pass first or the stream has ended (see
        `ended`). Raises Unavailable when the connection was lost."""
        await self._subscribed()
        if not self._events and not self._ended:
            assert self._changed is not None
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        if self._events:
            return self._events.popleft()
        if self._error is not None:
            raise self._error
        return None

    @property
    def ended(self) -> bool:
        return self._ended and not self._events

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        while True:
            event = await self.get()
            if event is not None:
                return event
            if self._ended:
                raise StopAsyncIteration

    def close(self) -> None:
        """Stops receiving; events already queued can still be read."""
        self._subscribe = None
        if self._on_close is not None:
            self._on_close(self)
        self._end(None)
