"""The events a stream holds for a reader that is behind, threads or asyncio alike. Bounded: a
host that never reads its stream must not grow without end. Past the bound, new events are
dropped and counted, and the reader gets a `dropped` event where they were lost, as the daemon
does for a subscriber that leaves its events unread."""

from __future__ import annotations

import collections
from typing import Deque

from .protocol import Event


class EventQueue:
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._events: Deque[Event] = collections.deque()
        self._dropped = 0

    def offer(self, event: Event) -> bool:
        """Queues `event`; False if it was dropped (the queue is full)."""
        if len(self._events) >= self._capacity:
            self._dropped += 1
            return False
        if self._dropped:
            self._events.append(Event.dropped(self._dropped))
            self._dropped = 0
        self._events.append(event)
        return True

    def __bool__(self) -> bool:
        return bool(self._events)

    def popleft(self) -> Event:
        return self._events.popleft()
