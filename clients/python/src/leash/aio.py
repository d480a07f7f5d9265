"""`leash.AsyncLease`: a host's lease for asyncio, with `create_subprocess_exec` and
`create_subprocess_shell` that start the command on the leash before it runs. No thread: the
connection is an asyncio stream read by a task of the lease's own."""

from __future__ import annotations

import asyncio
import os
from asyncio.subprocess import Process
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Optional,
    Tuple,
    Type,
    Union,
)

from . import _pidfd, _shim
from ._async_connection import AsyncConnection
from ._async_events import AsyncEventStream
from ._async_process import LeashedProcess, leashed, read_to_end, reap, tree_of
from ._connection import LOSS_NOTICE, NotSent
from ._lease_core import LeaseCore, log_close_error
from .errors import LeashError, NotFound, Unavailable
from .protocol import KillSummary, Tree, grace_ms, parse_killed, parse_registered

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import ProcessOptions

__all__ = ["AsyncEventStream", "AsyncLease", "LeashedProcess", "tree_of"]


class AsyncLease(LeaseCore[AsyncConnection]):
    """A connection to the leash daemon, and so a lease, for asyncio: every tree started under
    it is killed when this process dies, or the lease is closed, unless it was released.

        async with AsyncLease() as lease:            # or: lease = await AsyncLease.connect()
            agent = await lease.create_subprocess_exec("my-agent", "--acp", stdin=PIPE,
                                                       stdout=PIPE, start_new_session=True)

    The arguments are those of `leash.Lease` (`grace` in seconds, checked at once). If the
    connection ends, what waits for a reply raises ConnectionLost, whose message says what
    became of the trees (the daemon stopped and killed them, or handed them over to the next
    daemon, which enforces them), and the next call connects again, with a new lease. After
    aclose(), calls raise LeaseClosed. Use it from one event loop.
    """

    def __init__(
        self,
        socket: Optional[_shim.StrPath] = None,
        grace: Optional[float] = None,
        *,
        leash: Optional[_shim.StrPath] = None,
        optional: bool = False,
    ) -> None:
        super().__init__(socket, grace, leash, optional)
        # Made once a loop runs it (an asyncio.Lock of Python 3.9 binds to a loop when made).
        self._lock: Optional[asyncio.Lock] = None
        self._opened = False
        self._closing: Optional[asyncio.Future[None]] = None

    @classmethod
    async def connect(
        cls,
        socket: Optional[_shim.StrPath] = None,
        grace: Optional[float] = None,
        *,
        leash: Optional[_shim.StrPath] = None,
        optional: bool = False,
    ) -> AsyncLease:
        lease = cls(socket, grace, leash=leash, optional=optional)
        await lease._open()
        return lease

    async def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        try:
            await self._connect()
        except Unavailable as e:
            if not self.optional:
                raise
            self._unleashed.say(e, "the commands of this lease run")

    async def _connect(self) -> AsyncConnection:
        return (await self._connect_counted())[0]

    async def _connect_counted(self) -> Tuple[AsyncConnection, int]:
        """The live connection, made anew if there is none (or it was lost), and how many
        connections the lease has made."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            live = self._live_connection()
            if live is not None:
                return live, self._generation
            stale = self._stale_connection()
            if stale is not None:
                await stale.close()
            counted = self._trees_on_next_connection()
            return self._connected(await AsyncConnection.open(self.socket, counted))

    async def _request(self, op: str, **fields: Any) -> Any:
        return (await self._call(op, **fields))[0]

    async def _call(self, op: str, **fields: Any) -> Tuple[Any, AsyncConnection, int]:
        """A request's `ok` value, the connection that answered and its generation. A request
        that could not be sent (the connection was found lost) is sent once more, on a new
        connection: the next call connects again."""
        for attempt in range(2):
            connection, generation = await self._connect_counted()
            try:
                return await connection.request(op, **fields), connection, generation
            except NotSent as e:
                if attempt == 1:
                    raise e.error from None
        raise AssertionError("unreachable")

    # -- spawning --------------------------------------------------------------------------

    async def create_subprocess_exec(
        self,
        program: _shim.StrOrBytesPath,
        *args: _shim.StrOrBytesPath,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        **kwds: Unpack[ProcessOptions],
    ) -> LeashedProcess:
        """asyncio.create_subprocess_exec(program, *args, **kwds), the command on the leash
        before it runs: a tree of its own (`process.tree`), killed with its SIGTERM-to-SIGKILL
        `grace` in seconds (else the lease's) when this host dies, the lease closes, or (unless
        `keep_on_root_exit`) the command exits while processes it started remain.

        Raises as asyncio does when the command cannot be executed (FileNotFoundError for a
        missing program, PermissionError for one that is not executable), and Unavailable,
        PermissionDenied, LimitReached or LeashError when leash refuses it: then nothing of
        the command ever ran."""
        options: Dict[str, Any] = dict(kwds)
        plan = self._spawn_plan([program, *args], False, grace, keep_on_root_exit, options)
        return await self._spawn(
            plan, lambda: asyncio.create_subprocess_exec(program, *args, **options)
        )

    async def create_subprocess_shell(
        self,
        cmd: Union[str, bytes],
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        **kwds: Unpack[ProcessOptions],
    ) -> LeashedProcess:
        """asyncio.create_subprocess_shell(cmd, **kwds) on the leash: `/bin/sh -c cmd`."""
        options: Dict[str, Any] = dict(kwds)
        plan = self._spawn_plan(cmd, True, grace, keep_on_root_exit, options)
        return await self._spawn(plan, lambda: asyncio.create_subprocess_shell(cmd, **options))

    async def _spawn(
        self, plan: _shim.Spawn, unleashed: Callable[[], Awaitable[Process]]
    ) -> LeashedProcess:
        """`unleashed` starts the command as the caller asked, for optional=True."""
        for attempt in range(2):
            try:
                connection, generation = await self._connect_counted()
            except Unavailable as e:
                if not self.optional:
                    raise
                return await self._spawn_unleashed(unleashed, e, plan.command)
            proc, status = await self._spawn_shim(connection, plan)
            if self._hold_spawned(status, proc.pid, generation):
                return leashed(proc, status.tree)
            error = self._refusal(status, await reap(proc, read_stderr=status.error is None))
            if self._may_retry_on_new_lease(attempt, error) and await connection.wait_lost(
                LOSS_NOTICE
            ):
                continue
            reason = self._fallback_reason(error, status)
            if reason is not None:
                return await self._spawn_unleashed(unleashed, reason, plan.command)
            raise error
        raise AssertionError("unreachable")

    async def _spawn_shim(
        self, connection: AsyncConnection, plan: _shim.Spawn
    ) -> Tuple[Process, _shim.Status]:
        """Starts `leash exec ... -- command` and reads what it says, without blocking the
        loop."""
        assert self._leash is not None
        leash = self._leash
        pipes = _shim.ShimPipes(connection.lease.token)
        try:
            argv = plan.shim_argv(leash, connection.path, pipes)
            try:
                proc = await asyncio.create_subprocess_exec(*argv, **plan.shim_kwargs(pipes))
            except OSError as e:
                _shim.raise_if_leash_missing(e, leash)
                raise
            pipes.close_child_ends()
            try:
                status = plan.status(await read_to_end(pipes.status_read))
            except OSError as e:
                status = _shim.Status(error=_shim.status_read_error(e))
            except BaseException:
                # Cancelled while the shim starts: what it runs is nobody's to wait for.
                proc.kill()
                raise
        finally:
            pipes.close()
        return proc, status

    async def _spawn_unleashed(
        self,
        unleashed: Callable[[], Awaitable[Process]],
        reason: Unavailable,
        command: List[_shim.StrOrBytesPath],
    ) -> LeashedProcess:
        proc = leashed(await unleashed(), None)
        self._unleashed.say(reason, f"{_shim.describe(command)} (pid {proc.pid}) runs")
        return proc

    # -- trees -----------------------------------------------------------------------------

    async def adopt(
        self, pid: int, grace: Optional[float] = None, keep_on_root_exit: bool = False
    ) -> int:
        """Registers a running process, with the descendants it has, as a new tree of this
        lease; returns the tree. What it forks from then on is in the tree too. The process is
        named to the daemon by a pidfd, so this works in a container too."""
        fields = self._register_fields(pid, grace, keep_on_root_exit)
        pidfd = _pidfd.open_pidfd(pid)
        if pidfd is None:
            ok, _, generation = await self._call("register", **fields)
        else:
            try:
                ok, generation = await self._register_pidfd(pidfd, fields)
            finally:
                os.close(pidfd)
        tree = parse_registered(ok)
        self._held.add(tree, pid, generation)
        return tree

    async def _register_pidfd(self, pidfd: int, fields: Dict[str, Any]) -> Tuple[Any, int]:
        """As Lease._register_pidfd; the short connection runs on a worker thread."""
        del fields["pid"]
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            connection, generation = await self._connect_counted()
            token = connection.lease.token
            try:
                ok = await loop.run_in_executor(
                    None, _pidfd.register_pidfd, connection.path, token, pidfd, fields
                )
                return ok, generation
            except LeashError as error:
                if self._may_retry_on_new_lease(attempt, error) and await connection.wait_lost(
                    LOSS_NOTICE
                ):
                    continue
                raise
        raise AssertionError("unreachable")

    async def kill(self, tree: int, grace: Optional[float] = None) -> KillSummary:
        """Kills a tree: SIGTERM, then after `grace` seconds (else the tree's own) SIGKILL until
        none is left. Returns when the tree is empty."""
        try:
            reply = await self._request("kill", tree=tree, grace_ms=grace_ms(grace))
        except NotFound:
            self._held.discard(tree)
            raise
        self._held.discard(tree)
        return parse_killed(reply)

    async def release(self, tree: int) -> None:
        """Stops enforcing a tree: its processes are left alone from now on."""
        await self._request("release", tree=tree)
        self._held.discard(tree)

    async def trees(self) -> List[Tree]:
        """This lease's trees, as the daemon lists them (with trees it holds from before the
        connection was lost)."""
        ok, connection, _ = await self._call("list")
        return self._mine(ok, connection)

    def events(self) -> AsyncEventStream:
        """A stream of this lease's events: `async for event in lease.events()`. It subscribes
        when first read; `stream = await lease.events()` subscribes at once, for the events
        of what is spawned next."""

        async def subscribe(stream: AsyncEventStream) -> None:
            for attempt in range(2):
                connection = await self._connect()
                lease_id = connection.lease.id
                stream._wanted = self._held.events_of(lease_id)
                try:
                    await connection.subscribe(stream)
                    return
                except NotSent as e:
                    if attempt == 1:
                        raise e.error from None

        return AsyncEventStream(subscribe)

    # -- the end ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Kills every tree of this lease that was not released, waits until they are empty,
        and closes the connection. Raises LeashError if a tree could not be killed (the
        daemon then kills it as the lease ends)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        # Shielded: a caller cancelled meanwhile does not stop the kills under way.
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        errors: List[LeashError] = []
        try:
            for attempt in range(2):
                try:
                    if self._held.snapshot():
                        errors += await self._kill_held(*await self._connect_counted())
                    break
                except NotSent as e:
                    # Found lost as it was used: once more, on a new connection.
                    if attempt == 1:
                        errors.append(e.error)
        except LeashError as e:
            errors.append(e)
        finally:
            self._closed = True
            connection, self._connection = self._connection, None
            if connection is not None:
                await connection.close()
        if errors:
            raise errors[0]

    async def _kill_held(self, connection: AsyncConnection, generation: int) -> List[LeashError]:
        """Kills every tree held, all at once; returns the errors (a tree that is gone already
        is none)."""
        listing = None
        if self._held.from_earlier_connections(generation):
            listing = await connection.request("list")
        trees = self._to_kill(generation, listing)
        kills = [(t, await connection.submit("kill", tree=t)) for t in trees]
        errors: List[LeashError] = []
        for tree, kill in kills:
            try:
                await kill
            except NotFound:
                pass
            except LeashError as e:
                errors.append(e)
            self._held.discard(tree)
        return errors

    async def __aenter__(self) -> AsyncLease:
        await self._open()
        return self

    async def __aexit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if kind is None:
            await self.aclose()
            return
        try:
            await self.aclose()
        except LeashError as e:
            log_close_error(e)
