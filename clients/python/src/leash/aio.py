"""`leash.AsyncLease`: a host's lease for asyncio, with `create_subprocess_exec` and
`create_subprocess_shell` that start the command on the leash before it runs. No thread: the
connection is an asyncio stream read by a task of the lease's own."""

from __future__ import annotations

import asyncio
import logging
import os
from asyncio.subprocess import Process
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Optional,
    Tuple,
    Type,
    Union,
    cast,
)

from . import _pidfd, _shim
from ._connection import (
    EVENT_QUEUE_CAPACITY,
    LOSS_NOTICE,
    SEND_FAILED_READ_TIMEOUT,
    NotSent,
)
from ._event_queue import EventQueue
from ._fallback import tree_or_unleashed
from ._lease_core import LeaseCore, log_close_error
from ._replies import LineRouter, Settable, Stream
from .errors import LeaseClosed, LeashError, NotFound, Unavailable, cannot_connect
from .protocol import (
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Event,
    KillSummary,
    LeaseInfo,
    ProtocolError,
    Tree,
    encode,
    grace_ms,
    parse_hello,
    parse_killed,
    parse_registered,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import ProcessOptions

log = logging.getLogger("leash")


class LeashedProcess(Process):
    """An asyncio.subprocess.Process started by an AsyncLease: `pid` is the command's own and
    `tree` its tree. `leash_tree` is the tree or None, for a command started unleashed
    (`optional=True`, and leash was unavailable)."""

    leash_tree: Optional[int] = None

    @property
    def tree(self) -> int:
        """The command's tree; raises leash.Unleashed if it was started unleashed."""
        return tree_or_unleashed(self.leash_tree, self.pid)


def _leashed(proc: Process, tree: Optional[int]) -> LeashedProcess:
    """`proc`, as the LeashedProcess it is. asyncio makes the Process itself (and its
    transport and protocol with it), so the class is set on the object it made: a subclass
    with no state of its own beside `leash_tree`, so nothing else changes."""
    proc.__class__ = LeashedProcess
    leashed = cast(LeashedProcess, proc)
    leashed.leash_tree = tree
    return leashed


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


class _Connection(LineRouter):
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
    async def open(cls, path: str, count_trees: Callable[[], int]) -> _Connection:
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


class AsyncLease(LeaseCore[_Connection]):
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

    async def _connect(self) -> _Connection:
        return (await self._connect_counted())[0]

    async def _connect_counted(self) -> Tuple[_Connection, int]:
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
            return self._connected(await _Connection.open(self.socket, counted))

    async def _request(self, op: str, **fields: Any) -> Any:
        return (await self._call(op, **fields))[0]

    async def _call(self, op: str, **fields: Any) -> Tuple[Any, _Connection, int]:
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
                return _leashed(proc, status.tree)
            error = self._refusal(status, await _reap(proc, read_stderr=status.error is None))
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
        self, connection: _Connection, plan: _shim.Spawn
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
                status = plan.status(await _read_to_end(pipes.status_read))
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
        proc = _leashed(await unleashed(), None)
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

    async def _kill_held(self, connection: _Connection, generation: int) -> List[LeashError]:
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


def tree_of(process: Any) -> Optional[int]:
    """The leash tree of a process a lease started, or None (it runs unleashed, or no lease
    started it). `process.tree` is the tree, or raises Unleashed."""
    tree = getattr(process, "leash_tree", None)
    return tree if isinstance(tree, int) else None


async def _read_to_end(fd: int) -> bytes:
    """What the shim writes on its status descriptor, up to its end of file, without blocking
    the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    done: asyncio.Future[bytes] = loop.create_future()
    chunks: List[bytes] = []

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError as e:
            if not done.done():
                done.set_exception(e)
            return
        if not chunk:
            if not done.done():
                done.set_result(b"".join(chunks))
            return
        chunks.append(chunk)
        if sum(map(len, chunks)) > _shim.MAX_STATUS_BYTES and not done.done():
            done.set_exception(OSError(f"more than {_shim.MAX_STATUS_BYTES} bytes of status"))

    loop.add_reader(fd, readable)
    try:
        return await done
    finally:
        loop.remove_reader(fd)


async def _reap(proc: Process, read_stderr: bool) -> Tuple[Optional[int], Optional[bytes]]:
    """Waits for a shim that did not run its command; returns its exit status and, if asked
    and its stderr is a pipe of ours, what it said there."""
    stderr = None
    if proc.stdin is not None:
        proc.stdin.close()
    if read_stderr and proc.stderr is not None:
        stderr = await proc.stderr.read(_shim.MAX_STATUS_BYTES)
    return await proc.wait(), stderr
