"""Spawning through `leash exec`, the same for threads and asyncio.

The host starts `leash exec --lease-fd N --status-fd M -- CMD`: the shim reads the lease token
from a pipe (never argv, never CMD's environment), registers its own pid under the host's lease
and execs CMD, so CMD's pid is the shim's and nothing of CMD runs before it is on the leash. On
descriptor M it writes one JSON line: registered (and the tree), refused (the daemon's words),
then exec_failed if CMD could not be executed. M is close-on-exec: its end of file means CMD
runs. See `leash exec --help`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import LeashError, Unavailable, from_daemon

LEASH_BIN_ENV = "LEASH_BIN"
# The shim takes the token from here when it is given no descriptor, and refuses both: a host
# that itself runs with it set must not pass it on.
LEASE_ENV = "LEASH_LEASE"
# A status report is one short line or two; anything longer is not the shim talking.
MAX_STATUS_BYTES = 64 * 1024

StrPath = Union[str, "os.PathLike[str]"]
StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
Args = Union[StrOrBytesPath, Sequence[StrOrBytesPath]]


# The binary a platform wheel carries (hatch_build.py puts it there); the pure wheel has none.
PACKAGED_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "leash")


def _executable_file(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_leash(explicit: Optional[StrPath]) -> str:
    """The leash binary as an absolute path: `explicit`, else LEASH_BIN, else the one this
    package carries (a platform wheel's leash/_bin/leash), else `leash` on PATH. Resolved once,
    so that a later change of directory or PATH changes nothing."""
    chosen = os.fspath(explicit) if explicit is not None else os.environ.get(LEASH_BIN_ENV)
    if chosen:
        found = shutil.which(chosen) if os.sep not in chosen else chosen
        if found and _executable_file(found):
            return os.path.abspath(found)
        origin = "LEASH_BIN" if explicit is None else "the leash argument"
        raise Unavailable(f"{chosen} ({origin}) is not an executable leash binary")
    if _executable_file(PACKAGED_BINARY):
        return PACKAGED_BINARY
    found = shutil.which("leash")
    if found is not None:
        return os.path.abspath(found)
    packaged = (
        f"{PACKAGED_BINARY} is not executable"
        if os.path.exists(PACKAGED_BINARY)
        else f"this package carries none ({PACKAGED_BINARY}: a platform wheel of leash-client "
        "has one)"
    )
    raise Unavailable(
        f"no leash binary: LEASH_BIN is not set, {packaged}, and there is no `leash` on PATH "
        f"({os.environ.get('PATH', '')}): install leash-client's wheel for this platform, "
        "install leash, or name the binary with LEASH_BIN (or Lease(leash=PATH))"
    )


def command_line(
    args: Args, shell: bool, executable: Optional[StrOrBytesPath]
) -> Tuple[List[StrOrBytesPath], Optional[StrOrBytesPath]]:
    """What subprocess.Popen would execute: the command (program first) and, when the program
    is not its own argv[0] (`executable=`), the argv[0] to give it."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv: List[StrOrBytesPath] = [args]
    else:
        argv = list(args)
    if shell:
        # As Popen: the shell (or `executable`, which then is argv[0] too) runs the string.
        return [executable if executable is not None else "/bin/sh", "-c", *argv], None
    if not argv:
        raise ValueError("an empty command: args must name a program")
    if executable is not None:
        return [executable, *argv[1:]], argv[0]
    return argv, None


@dataclass
class Spawn:
    """A command to start through the shim: what Popen would execute, the shim's options, and
    the keyword arguments for the spawning call (the shim's environment, less the token)."""

    command: List[StrOrBytesPath]
    argv0: Optional[StrOrBytesPath]
    grace_ms: Optional[int]
    keep_on_root_exit: bool
    kwargs: Dict[str, Any]

    @classmethod
    def of(
        cls,
        args: Args,
        shell: bool,
        grace_ms: Optional[int],
        keep_on_root_exit: bool,
        kwargs: Mapping[str, Any],
    ) -> Spawn:
        """`kwargs` are the caller's; `executable` goes into the command (the shim execs it)."""
        kwargs = dict(kwargs)
        command, argv0 = command_line(args, shell, kwargs.pop("executable", None))
        kwargs["env"] = environment_without_token(kwargs.get("env"))
        return cls(command, argv0, grace_ms, keep_on_root_exit, kwargs)

    def shim_argv(self, leash: str, socket: str, pipes: ShimPipes) -> List[StrOrBytesPath]:
        argv: List[StrOrBytesPath] = [leash, "--socket", socket, "exec"]
        argv += ["--lease-fd", str(pipes.lease_fd), "--status-fd", str(pipes.status_write)]
        if self.grace_ms is not None:
            argv += ["--grace", f"{self.grace_ms}ms"]
        if self.keep_on_root_exit:
            argv.append("--keep-on-root-exit")
        if self.argv0 is not None:
            argv += ["--argv0", self.argv0]
        return [*argv, "--", *self.command]

    def shim_kwargs(self, pipes: ShimPipes) -> Dict[str, Any]:
        """The keyword arguments, with the shim's descriptors passed."""
        return popen_fd_kwargs(self.kwargs, pipes)

    def status(self, data: bytes) -> Status:
        return parse_status(data, self.command[0])


def environment_without_token(env: Optional[Mapping[Any, Any]]) -> Optional[Mapping[Any, Any]]:
    """The environment for the shim: the caller's, less a LEASH_LEASE it may hold."""
    if env is None:
        if LEASE_ENV not in os.environ:
            return None
        env = os.environ
    if LEASE_ENV not in env and LEASE_ENV.encode() not in env:
        return env
    return {k: v for k, v in env.items() if k not in (LEASE_ENV, LEASE_ENV.encode())}


def _above_stdio(fd: int) -> int:
    """`fd` moved to 3 or above (the shim refuses 0-2: they are the command's stdio)."""
    if fd >= 3:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def inheritable_fds() -> List[int]:
    """The descriptors a child inherits with close_fds=False, from 3 up."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        names = os.listdir("/dev/fd")
    fds = []
    for name in names:
        fd = int(name)
        try:
            if fd >= 3 and os.get_inheritable(fd):
                fds.append(fd)
        except OSError:  # the directory's own descriptor, closed by now
            pass
    return fds


class ShimPipes:
    """The token pipe (its write end already written and closed) and the status pipe. The
    parent's ends are close-on-exec, so no other child inherits them; the child gets its ends
    through pass_fds."""

    def __init__(self, token: str) -> None:
        self.lease_fd = -1
        self.status_read = -1
        self.status_write = -1
        try:
            lease_read, lease_write = os.pipe()
            self.lease_fd = _above_stdio(lease_read)
            try:
                # A token is 32 bytes: far below a pipe's buffer, so this never blocks.
                os.write(lease_write, token.encode() + b"\n")
            finally:
                os.close(lease_write)
            status_read, status_write = os.pipe()
            self.status_read = status_read
            self.status_write = _above_stdio(status_write)
        except BaseException:
            self.close()
            raise

    def child_fds(self) -> Tuple[int, int]:
        return self.lease_fd, self.status_write

    def close_child_ends(self) -> None:
        """Once the child is started: the status pipe then reads its end of file when the shim
        has written and the command runs (or the shim is gone)."""
        for fd in (self.lease_fd, self.status_write):
            if fd >= 0:
                os.close(fd)
        self.lease_fd = self.status_write = -1

    def close(self) -> None:
        self.close_child_ends()
        if self.status_read >= 0:
            os.close(self.status_read)
            self.status_read = -1


def popen_fd_kwargs(kwargs: Dict[str, Any], pipes: ShimPipes) -> Dict[str, Any]:
    """`kwargs` for Popen, with the shim's descriptors passed. Popen turns close_fds=False into
    True when pass_fds is given; so close_fds=False is kept by passing every descriptor the
    child would have inherited."""
    kwargs = dict(kwargs)
    passed = list(kwargs.pop("pass_fds", ()))
    if not kwargs.pop("close_fds", True):
        passed += inheritable_fds()
    kwargs["pass_fds"] = (*passed, *pipes.child_fds())
    kwargs["close_fds"] = True
    return kwargs


@dataclass
class Status:
    """What the shim said: the tree it registered, or why nothing runs (`error`: the
    exception to raise once the shim is reaped). Neither: it ended without a word."""

    tree: Optional[int] = None
    error: Optional[BaseException] = None


def parse_status(data: bytes, program: StrOrBytesPath) -> Status:
    lines = [line for line in data.split(b"\n") if line.strip()]
    if not lines:
        return Status()
    try:
        reports = [json.loads(line) for line in lines]
        first = reports[0]
        if "error" in first:
            error = first["error"]
            return Status(error=from_daemon(str(error["code"]), str(error["message"])))
        tree = int(first["registered"]["tree"])
        for report in reports[1:]:
            if "exec_failed" in report:
                return Status(tree=tree, error=exec_error(report["exec_failed"], program))
        return Status(tree=tree)
    except (ValueError, KeyError, TypeError) as e:
        return Status(
            error=LeashError(
                f"leash exec wrote what this library cannot read ({e!r}): {data[:500]!r}"
            )
        )


# What an exec failure means for the command, beside the system's words.
_EXEC_FAILURES = {
    errno.ENOENT: "command not found",
    errno.EACCES: "not executable, or a directory on its path is not searchable",
    errno.ENOEXEC: "not executable: not a program, nor a script with a #! line",
}


def exec_error(report: Mapping[str, Any], program: StrOrBytesPath) -> OSError:
    """The OSError Popen raises when it cannot execute a program, with the program as its
    filename: FileNotFoundError for ENOENT ("command not found"), PermissionError for EACCES
    and for ENOEXEC (a file that is not a program: not executable either way), an OSError of
    the errno otherwise."""
    name = os.fsdecode(program)
    code = report.get("errno")
    if not isinstance(code, int) or code <= 0:
        return OSError(str(report.get("message", f"could not execute {name}")))
    words = os.strerror(code)
    meaning = _EXEC_FAILURES.get(code)
    if meaning is not None:
        words = f"{words} ({meaning})"
    if code == errno.ENOEXEC:
        return PermissionError(code, words, name)
    # OSError(errno, ...) is made the subclass of the errno: FileNotFoundError, PermissionError.
    return OSError(code, words, name)


def no_word(leash: str, returncode: Optional[int], stderr: Optional[bytes]) -> LeashError:
    """The shim ended before it could say anything: killed, or a leash too old to know
    --status-fd (which then says so on stderr and exits 2)."""
    said = (
        f": it said {stderr.decode(errors='replace').strip()!r}"
        if stderr
        else "; its standard error says why"
    )
    return LeashError(
        f"leash exec ended without a word (exit status {returncode}){said}. It was killed, "
        f"or {leash} is older than its --status-fd option: then upgrade leash"
    )


def status_read_error(error: OSError) -> LeashError:
    return LeashError(f"reading the status of leash exec: {error}")


def raise_if_leash_missing(error: OSError, leash: str) -> None:
    """Raises Unavailable if starting the shim failed because leash itself could not be
    executed (a binary removed since it was found), not the command."""
    if error.filename is not None and os.fsdecode(error.filename) == leash:
        raise Unavailable(f"cannot execute leash at {leash}: {error}") from error


def describe(args: Args) -> str:
    """A command, shortly, for messages."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
    else:
        text = " ".join(os.fsdecode(a) for a in args)
    return repr(text if len(text) <= 80 else text[:77] + "...")
