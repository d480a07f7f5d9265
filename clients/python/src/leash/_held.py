"""The trees a lease registered and has neither released nor killed: what `close()` kills.

Tree ids are unique while a daemon runs, but a daemon started afresh counts from 1 again, and
one that takes over counts on from the highest tree it finds. So a tree held from an earlier
connection (`generation`) is trusted only when the daemon still lists it with the same root and
with this process as its host: never kill another host's tree that took an old number.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List

from .protocol import Event, Tree


@dataclass(frozen=True)
class Held:
    root: int
    generation: int


class HeldTrees:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: Dict[int, Held] = {}

    def add(self, tree: int, root: int, generation: int) -> None:
        with self._lock:
            self._held[tree] = Held(root, generation)

    def discard(self, tree: int) -> None:
        with self._lock:
            self._held.pop(tree, None)

    def __contains__(self, tree: object) -> bool:
        with self._lock:
            return tree in self._held

    def snapshot(self) -> Dict[int, Held]:
        with self._lock:
            return dict(self._held)

    def from_earlier_connections(self, generation: int) -> bool:
        return any(h.generation != generation for h in self.snapshot().values())

    def current(self, generation: int) -> List[int]:
        return [t for t, h in self.snapshot().items() if h.generation == generation]

    def counter(self, generation: int) -> Callable[[], int]:
        """How many trees are held on connection `generation`, asked later."""
        return lambda: len(self.current(generation))

    def events_of(self, lease_id: int) -> Callable[[Event], bool]:
        """Which events a lease's stream shows: its own, and its trees' from before."""

        def wanted(event: Event) -> bool:
            return event.lease == lease_id or event.tree in self

        return wanted

    def is_mine(self, tree: Tree, lease_id: int) -> bool:
        if tree.lease == lease_id:
            return True
        held = self.snapshot().get(tree.tree)
        return held is not None and held.root == tree.root and tree.host_pid == os.getpid()

    def earlier_still_listed(self, listing: Iterable[Tree], generation: int) -> List[int]:
        """The trees held from earlier connections that the daemon still lists as ours; the
        others are forgotten (ended, or their number taken by another host's tree)."""
        held = self.snapshot()
        listed = {t.tree: t for t in listing}
        found = []
        for tree, h in held.items():
            if h.generation == generation:
                continue
            t = listed.get(tree)
            if t is not None and t.root == h.root and t.host_pid == os.getpid():
                found.append(tree)
            else:
                self.discard(tree)
        return found
