"""`leash.Lease`: a host's lease for threaded code, with `popen`, a drop-in for
subprocess.Popen whose command is on the leash before it runs."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    AnyStr,
    Dict,
    List,
    Literal,
    Optional,
    Tuple,
    Type,
    overload,
)

from . import _pidfd, _shim
from ._connection import LOSS_NOTICE, Connection, EventStream, NotSent
from ._fallback import tree_or_unleashed
from ._lease_core import LeaseCore, log_close_error
from .errors import LeashError, NotFound, Unavailable
from .protocol import KillSummary, Tree, grace_ms, parse_killed, parse_registered

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._options import PopenOptions

log = logging.getLogger("leash")


class LeashedPopen(subprocess.Popen[AnyStr]):
    """A subprocess.Popen (`LeashedPopen[str]` with text=True, as `Popen[str]`), whose `pid`
    is the command's own and `tree` its tree. `leash_tree` is the tree or None, for a command
    started unleashed (`optional=True`, and leash was unavailable)."""

    leash_tree: Optional[int] = None

    @property
    def tree(self) -> int:
        """The command's tree; raises leash.Unleashed if it was started unleashed."""
        return tree_or_unleashed(self.leash_tree, self.pid)


class Lease(LeaseCore[Connection]):
    """A connection to the leash daemon, and so a lease: every tree started under it is killed
    when this process dies, or the lease is closed, unless it was released.

    `socket`: the daemon's socket (else LEASH_SOCKET, else /run/leash/leash.sock). `grace`: the
    seconds (a float) between SIGTERM and SIGKILL for the trees it starts (else the daemon's,
    2 s), from 0 to 600: checked here, ValueError otherwise. `leash`: the leash binary to spawn
    through (else LEASH_BIN, else the one a platform wheel carries, else `leash` on PATH).
    `optional=True`: if leash is unavailable,
    start commands unleashed, with one UnleashedWarning for the lease, instead of raising
    Unavailable.

    Thread-safe. If the connection ends, what waits for a reply raises ConnectionLost, whose
    message says what became of the trees (the daemon stopped and killed them, or handed them
    over to the next daemon, which enforces them), and the next call connects again, with a
    new lease. After close(), calls raise LeaseClosed.
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
        self._lock = threading.Lock()
        # Held through close(): a second caller returns when the first is done.
        self._close_lock = threading.Lock()
        try:
            self._connect()
        except Unavailable as e:
            if not optional:
                raise
            self._unleashed.say(e, "the commands of this lease run")

    # -- the connection --------------------------------------------------------------------

    def _connect(self) -> Connection:
        """The live connection, made anew if there is none (or it was lost)."""
        return self._connect_counted()[0]

    def _connect_counted(self) -> Tuple[Connection, int]:
        """The live connection, and how many connections the lease has made."""
        with self._lock:
            live = self._live_connection()
            if live is not None:
                return live, self._generation
            stale = self._stale_connection()
            if stale is not None:
                stale.close()
            return self._connected(Connection(self.socket, self._trees_on_next_connection()))

    def _request(self, op: str, **fields: Any) -> Any:
        return self._call(op, **fields)[0]

    def _call(self, op: str, **fields: Any) -> Tuple[Any, Connection, int]:
        """A request's `ok` value, the connection that answered and its generation. A request
        that could not be sent (the connection was found lost) is sent once more, on a new
        connection: the next call connects again."""
        for attempt in range(2):
            connection, generation = self._connect_counted()
            try:
                return connection.request(op, **fields), connection, generation
            except NotSent as e:
                if attempt == 1:
                    raise e.error from None
        raise AssertionError("unreachable")

    # -- spawning --------------------------------------------------------------------------

    # The overloads of subprocess.Popen (typeshed's): text=True, an encoding, errors or
    # universal_newlines give LeashedPopen[str]; none of them, LeashedPopen[bytes].
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Optional[bool] = None,
        encoding: str,
        errors: Optional[str] = None,
        universal_newlines: Optional[bool] = None,
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[str]: ...
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Optional[bool] = None,
        encoding: Optional[str] = None,
        errors: str,
        universal_newlines: Optional[bool] = None,
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[str]: ...
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Optional[bool] = None,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        universal_newlines: Literal[True],
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[str]: ...
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Literal[True],
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        universal_newlines: Optional[bool] = None,
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[str]: ...
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Optional[Literal[False]] = None,
        encoding: None = None,
        errors: None = None,
        universal_newlines: Optional[Literal[False]] = None,
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[bytes]: ...
    @overload
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        text: Optional[bool] = None,
        encoding: Optional[str] = None,
        errors: Optional[str] = None,
        universal_newlines: Optional[bool] = None,
        **popen_kwargs: Unpack[PopenOptions],
    ) -> LeashedPopen[Any]: ...
    def popen(
        self,
        args: _shim.Args,
        *,
        grace: Optional[float] = None,
        keep_on_root_exit: bool = False,
        **popen_kwargs: Any,
    ) -> LeashedPopen[Any]:
        """subprocess.Popen(args, **popen_kwargs), its command on the leash before it runs: a
        tree of its own (`proc.tree`), killed with its SIGTERM-to-SIGKILL `grace` in seconds
        (else the lease's) when this host dies, the lease closes, or (unless
        `keep_on_root_exit`) the command itself exits while processes it started remain.

        Raises as Popen does when the command cannot be executed (FileNotFoundError for a
        missing program, PermissionError for one that is not executable), and
        Unavailable, PermissionDenied, LimitReached or LeashError when leash refuses it: then
        nothing of the command ever ran."""
        # The shell is the shim's to run, as Popen would have.
        shim_kwargs = {k: v for k, v in popen_kwargs.items() if k != "shell"}
        shell = popen_kwargs.get("shell", False)
        plan = self._spawn_plan(args, shell, grace, keep_on_root_exit, shim_kwargs)
        for attempt in range(2):
            try:
                connection, generation = self._connect_counted()
            except Unavailable as e:
                if not self.optional:
                    raise
                return self._popen_unleashed(args, e, popen_kwargs)
            proc, status = self._spawn_shim(connection, plan)
            if self._hold_spawned(status, proc.pid, generation):
                # What the caller asked to run, as Popen keeps it (CalledProcessError shows it).
                proc.args = args
                proc.leash_tree = status.tree
                return proc
            error = self._refusal(status, _reap(proc, read_stderr=status.error is None))
            if self._may_retry_on_new_lease(attempt, error) and connection.wait_lost(LOSS_NOTICE):
                continue
            reason = self._fallback_reason(error, status)
            if reason is not None:
                return self._popen_unleashed(args, reason, popen_kwargs)
            raise error
        raise AssertionError("unreachable")

    def _spawn_shim(
        self, connection: Connection, plan: _shim.Spawn
    ) -> Tuple[LeashedPopen[Any], _shim.Status]:
        """Starts `leash exec ... -- command` and reads what it says."""
        assert self._leash is not None
        leash = self._leash
        pipes = _shim.ShimPipes(connection.lease.token)
        try:
            argv = plan.shim_argv(leash, connection.path, pipes)
            try:
                proc: LeashedPopen[Any] = LeashedPopen(argv, **plan.shim_kwargs(pipes))
            except OSError as e:
                _shim.raise_if_leash_missing(e, leash)
                raise
            pipes.close_child_ends()
            try:
                status = plan.status(_read_to_end(pipes.status_read))
            except OSError as e:
                status = _shim.Status(error=_shim.status_read_error(e))
            except BaseException:
                # Interrupted while the shim starts: what it runs is nobody's to wait for.
                proc.kill()
                proc.wait()
                raise
        finally:
            pipes.close()
        return proc, status

    def _popen_unleashed(
        self, args: _shim.Args, reason: Unavailable, popen_kwargs: Dict[str, Any]
    ) -> LeashedPopen[Any]:
        proc: LeashedPopen[Any] = LeashedPopen(args, **popen_kwargs)
        self._unleashed.say(reason, f"{_shim.describe(args)} (pid {proc.pid}) runs")
        return proc

    # -- trees -----------------------------------------------------------------------------

    def adopt(
        self, pid: int, grace: Optional[float] = None, keep_on_root_exit: bool = False
    ) -> int:
        """Registers a running process, with the descendants it has, as a new tree of this
        lease; returns the tree. What it forks from then on is in the tree too. The process is
        named to the daemon by a pidfd, so this works in a container too."""
        fields = self._register_fields(pid, grace, keep_on_root_exit)
        pidfd = _pidfd.open_pidfd(pid)
        if pidfd is None:
            ok, _, generation = self._call("register", **fields)
        else:
            try:
                ok, generation = self._register_pidfd(pidfd, fields)
            finally:
                os.close(pidfd)
        tree = parse_registered(ok)
        self._held.add(tree, pid, generation)
        return tree

    def _register_pidfd(self, pidfd: int, fields: Dict[str, Any]) -> Tuple[Any, int]:
        """Registers the process of `pidfd` under this lease: the reply's `ok` and the
        generation of the connection whose lease holds it. Once more on a new lease if the
        daemon did not know the token (it restarted)."""
        del fields["pid"]
        for attempt in range(2):
            connection, generation = self._connect_counted()
            try:
                ok = _pidfd.register_pidfd(connection.path, connection.lease.token, pidfd, fields)
                return ok, generation
            except LeashError as error:
                if self._may_retry_on_new_lease(attempt, error) and connection.wait_lost(
                    LOSS_NOTICE
                ):
                    continue
                raise
        raise AssertionError("unreachable")

    def kill(self, tree: int, grace: Optional[float] = None) -> KillSummary:
        """Kills a tree: SIGTERM, then after `grace` seconds (else the tree's own) SIGKILL until
        none is left. Returns when the tree is empty."""
        try:
            summary = parse_killed(self._request("kill", tree=tree, grace_ms=grace_ms(grace)))
        except NotFound:
            self._held.discard(tree)
            raise
        self._held.discard(tree)
        return summary

    def release(self, tree: int) -> None:
        """Stops enforcing a tree: its processes are left alone from now on."""
        self._request("release", tree=tree)
        self._held.discard(tree)

    def trees(self) -> List[Tree]:
        """This lease's trees, as the daemon lists them (with trees it holds from before the
        connection was lost)."""
        ok, connection, _ = self._call("list")
        return self._mine(ok, connection)

    def events(self) -> EventStream:
        """A stream of this lease's events from now on (subscribes the first time)."""
        for attempt in range(2):
            connection = self._connect()
            lease_id = connection.lease.id
            stream = EventStream(self._held.events_of(lease_id))
            try:
                connection.subscribe(stream)
                return stream
            except NotSent as e:
                if attempt == 1:
                    raise e.error from None
        raise AssertionError("unreachable")

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """Kills every tree of this lease that was not released, waits until they are empty,
        and closes the connection. Raises LeashError if a tree could not be killed (the
        daemon then kills it as the lease ends)."""
        with self._close_lock:
            self._close()

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
        errors: List[LeashError] = []
        try:
            for attempt in range(2):
                try:
                    if self._held.snapshot():
                        errors += self._kill_held(*self._connect_counted())
                    break
                except NotSent as e:
                    # Found lost as it was used: once more, on a new connection.
                    if attempt == 1:
                        errors.append(e.error)
        except LeashError as e:
            errors.append(e)
        finally:
            with self._lock:
                self._closed = True
                connection = self._connection
                self._connection = None
            if connection is not None:
                connection.close()
        if errors:
            raise errors[0]

    def _kill_held(self, connection: Connection, generation: int) -> List[LeashError]:
        """Kills every tree held, all at once; returns the errors (a tree that is gone already
        is none)."""
        listing = None
        if self._held.from_earlier_connections(generation):
            listing = connection.request("list")
        kills = [(t, connection.submit("kill", tree=t)) for t in self._to_kill(generation, listing)]
        errors: List[LeashError] = []
        for tree, kill in kills:
            try:
                kill.result()
            except NotFound:
                pass
            except LeashError as e:
                errors.append(e)
            self._held.discard(tree)
        return errors

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        kind: Optional[Type[BaseException]],
        value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if kind is None:
            self.close()
            return
        try:
            self.close()
        except LeashError as e:
            log_close_error(e)


def _read_to_end(fd: int) -> bytes:
    """What the shim writes on its status descriptor, up to its end of file (the command runs,
    or the shim is gone)."""
    chunks: List[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > _shim.MAX_STATUS_BYTES:
            raise OSError(f"more than {_shim.MAX_STATUS_BYTES} bytes of status")
        chunks.append(chunk)


def _reap(proc: LeashedPopen[Any], read_stderr: bool) -> Tuple[Optional[int], Optional[bytes]]:
    """Waits for a shim that did not run its command; returns its exit status and, if asked
    and its stderr is a pipe (nobody will read it now: this child is never handed back), what
    it said there. A stderr that is not a pipe got the shim's words itself."""
    stderr = None
    if read_stderr and proc.stderr is not None:
        data = proc.stderr.read(_shim.MAX_STATUS_BYTES)
        stderr = data if isinstance(data, bytes) else str(data).encode()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    return proc.wait(), stderr
