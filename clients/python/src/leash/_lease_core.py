"""What `Lease` and `AsyncLease` decide alike, with no I/O: the lease's settings and state, when
a connection is made anew, what a spawn's status means (run, go again, fall back, raise), and
the trees held. Each class keeps only what blocks (threads) or awaits (asyncio)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Generic, List, Optional, Protocol, Tuple, TypeVar

from . import _shim
from ._fallback import UnleashedNotice
from ._held import HeldTrees
from .errors import LeaseClosed, LeashError, NotFound, Unavailable
from .protocol import LeaseInfo, Tree, grace_ms, parse_trees, register_fields, socket_path

log = logging.getLogger("leash")


class ConnectionLike(Protocol):
    """What the core reads of a connection, threaded or asyncio."""

    path: str
    lease: LeaseInfo

    @property
    def lost(self) -> bool: ...


C = TypeVar("C", bound=ConnectionLike)


class LeaseCore(Generic[C]):
    """The state both leases share. `_connection` is the live or last connection; `_generation`
    counts the connections made, so that a tree is known by the one it was registered on."""

    def __init__(
        self,
        socket: Optional[_shim.StrPath],
        grace: Optional[float],
        leash: Optional[_shim.StrPath],
        optional: bool,
    ) -> None:
        self.socket = socket_path(socket)
        grace_ms(grace)  # checked now, not at the first spawn
        self.grace = grace
        self.optional = optional
        self._leash_arg = leash
        self._leash: Optional[str] = None
        self._connection: Optional[C] = None
        self._generation = 0
        self._held = HeldTrees()
        self._closed = False
        self._unleashed = UnleashedNotice()

    @property
    def leashed(self) -> bool:
        """Whether the lease holds a live connection to the daemon."""
        connection = self._connection
        return connection is not None and not connection.lost

    @property
    def lease_id(self) -> Optional[int]:
        """The daemon's id of this lease (a new lease's once it connects again); None
        while unleashed."""
        connection = self._connection
        return None if connection is None else connection.lease.id

    # -- the connection --------------------------------------------------------------------

    def _live_connection(self) -> Optional[C]:
        """The connection if it is live; None if one is to be made (call under the lease's
        lock). Raises if the lease is closed, or leash cannot be found: then no connection is
        made, as nothing could be spawned through it."""
        if self._closed:
            raise LeaseClosed()
        if self._leash is None:
            self._leash = _shim.find_leash(self._leash_arg)
        connection = self._connection
        return connection if connection is not None and not connection.lost else None

    def _stale_connection(self) -> Optional[C]:
        """The lost connection a new one replaces (to be closed), if any."""
        stale = self._connection
        if stale is not None:
            log.info("connecting to the leash daemon again at %s", self.socket)
        return stale

    def _trees_on_next_connection(self) -> Callable[[], int]:
        """How many trees the lease holds on the connection it makes next (call under the
        lease's lock): what the daemon kills if that connection is ended by this side."""
        return self._held.counter(self._generation + 1)

    def _connected(self, connection: C) -> Tuple[C, int]:
        self._connection = connection
        self._generation += 1
        return connection, self._generation

    # -- spawning --------------------------------------------------------------------------

    def _spawn_plan(
        self,
        args: _shim.Args,
        shell: bool,
        grace: Optional[float],
        keep_on_root_exit: bool,
        kwargs: Dict[str, Any],
    ) -> _shim.Spawn:
        return _shim.Spawn.of(
            args, shell, grace_ms(self.grace if grace is None else grace), keep_on_root_exit, kwargs
        )

    def _hold_spawned(self, status: _shim.Status, pid: int, generation: int) -> bool:
        """Whether the shim registered the command and runs it; its tree is then held."""
        if status.tree is None or status.error is not None:
            return False
        self._held.add(status.tree, pid, generation)
        return True

    def _refusal(
        self, status: _shim.Status, reaped: Tuple[Optional[int], Optional[bytes]]
    ) -> BaseException:
        """Why a spawn failed, once its shim is reaped (its stderr read if it said nothing)."""
        if status.error is not None:
            return status.error
        return _shim.no_word(self._leash or "leash", *reaped)

    @staticmethod
    def _may_retry_on_new_lease(attempt: int, error: BaseException) -> bool:
        """An unknown token: the daemon that answered the shim may not be the one this lease
        was made with (it restarted). The command never ran: it may go once more, on a new
        lease, once the connection is seen lost."""
        return attempt == 0 and isinstance(error, NotFound)

    def _fallback_reason(self, error: BaseException, status: _shim.Status) -> Optional[Unavailable]:
        """Why the command runs unleashed instead; None if it does not (it does only with
        optional=True, when leash is unavailable and nothing ran)."""
        if isinstance(error, Unavailable) and self.optional and status.tree is None:
            return error
        return None

    # -- trees -----------------------------------------------------------------------------

    def _register_fields(
        self, pid: int, grace: Optional[float], keep_on_root_exit: bool
    ) -> Dict[str, Any]:
        return register_fields(pid, self.grace if grace is None else grace, keep_on_root_exit)

    def _mine(self, listing: Any, connection: C) -> List[Tree]:
        """The trees of a `list` reply that are this lease's, or held from before."""
        return [t for t in parse_trees(listing) if self._held.is_mine(t, connection.lease.id)]

    def _to_kill(self, generation: int, listing: Optional[Any]) -> List[int]:
        """The trees close() kills: those of this connection, and those from earlier ones that
        the daemon still lists as ours (`listing`, asked for when `_held` has any)."""
        trees = self._held.current(generation)
        if listing is not None:
            trees += self._held.earlier_still_listed(parse_trees(listing), generation)
        return trees


def log_close_error(error: LeashError) -> None:
    """close() failed while an exception was under way: that one says more; this one is
    logged, not lost."""
    log.warning("closing the lease: %s", error)
