"""The leash protocol, version 1 (docs/PROTOCOL.md): JSON lines over a Unix socket. Requests
are encoded here, and replies and events decoded into dataclasses; no I/O happens here."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from .errors import LeashError, from_daemon, quote_line

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/leash/leash.sock"
SOCKET_ENV = "LEASH_SOCKET"
# Replies can be long (`list` of thousands of members); this bounds the memory one line may
# take, as the Rust client does.
MAX_LINE_BYTES = 256 * 1024 * 1024
# The most grace the daemon accepts (10 minutes: leash-client's MAX_GRACE_MS).
MAX_GRACE_MS = 600_000
MAX_GRACE_SECONDS = MAX_GRACE_MS / 1000

Json = Dict[str, Any]

# The words of the protocol's enums, as the daemon writes them (a test of the Rust workspace
# checks each list against the daemon's). A newer daemon may send words not listed here: the
# fields that carry them are typed `str`.
#: What an `Event` is about (`Event.kind`).
EventKind = Literal[
    "registered",
    "root_exited",
    "kill_started",
    "tree_empty",
    "released",
    "fork",
    "exec",
    "exit",
    "dropped",
    "kill_failed",
    "closing",
    "refused",
]
#: Why a tree was killed (`KillSummary.reason`, and `Event.reason` of `kill_started`).
KillReason = Literal[
    "request",
    "root_exited",
    "lease_ended",
    "enclosing_killed",
    "member_quota",
    "untrackable",
    "resumed",
    "shutdown",
]


def socket_path(socket: Union[str, os.PathLike[str], None]) -> str:
    """The socket to use: the argument, else LEASH_SOCKET, else the default; absolute, since
    the exec shim may run in another directory."""
    chosen = os.fspath(socket) if socket is not None else os.environ.get(SOCKET_ENV) or ""
    return os.path.abspath(chosen or DEFAULT_SOCKET)


def grace_ms(grace: Optional[float]) -> Optional[int]:
    """A grace in seconds (a float: 0.5 is half a second) as the daemon takes it, in whole
    milliseconds. Raises ValueError for one the daemon would refuse: negative, NaN, infinite or
    over its maximum of 600 seconds."""
    if grace is None:
        return None
    if isinstance(grace, bool) or not isinstance(grace, (int, float)):
        raise TypeError(f"grace is a number of seconds, not {grace!r}")
    seconds = float(grace)
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_GRACE_SECONDS):
        raise ValueError(
            f"grace must be a number of seconds from 0 to {MAX_GRACE_SECONDS:g} (the daemon's "
            f"maximum), not {grace!r}"
        )
    return round(seconds * 1000)


def encode(request_id: int, op: str, **fields: Any) -> bytes:
    """One request line; fields that are None are left out (the daemon's defaults)."""
    request: Json = {"id": request_id, "op": op}
    request.update({k: v for k, v in fields.items() if v is not None})
    return json.dumps(request, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class KillSummary:
    """How a kill went; it is over when this exists: the tree is empty."""

    tree: int
    terminated: int
    killed: int
    rounds: int
    elapsed_ms: int
    reason: str

    @classmethod
    def from_json(cls, value: Json) -> KillSummary:
        return cls(
            tree=int(value["tree"]),
            terminated=int(value.get("terminated", 0)),
            killed=int(value.get("killed", 0)),
            rounds=int(value.get("rounds", 0)),
            elapsed_ms=int(value.get("elapsed_ms", 0)),
            reason=str(value.get("reason", "")),
        )


@dataclass(frozen=True)
class Member:
    pid: int
    parent: int
    start_ns: int
    comm: Optional[str]

    @classmethod
    def from_json(cls, value: Json) -> Member:
        return cls(
            pid=int(value["pid"]),
            parent=int(value.get("parent", 0)),
            start_ns=int(value.get("start_ns", 0)),
            comm=value.get("comm"),
        )


@dataclass(frozen=True)
class Tree:
    """A tree as `list` shows it."""

    tree: int
    lease: int
    owner_uid: int
    root: int
    on_root_exit: str
    grace_ms: int
    host_pid: int
    host_comm: Optional[str]
    root_exited: bool
    state: str
    member_count: int
    members: List[Member] = field(default_factory=list)
    members_truncated: bool = False
    nested_in: Optional[int] = None

    @property
    def grace(self) -> float:
        """The tree's grace between SIGTERM and SIGKILL, in seconds."""
        return self.grace_ms / 1000

    @classmethod
    def from_json(cls, value: Json) -> Tree:
        nested_in = value.get("nested_in")
        return cls(
            tree=int(value["tree"]),
            lease=int(value["lease"]),
            owner_uid=int(value.get("owner_uid", 0)),
            root=int(value.get("root", 0)),
            on_root_exit=str(value.get("on_root_exit", "kill")),
            grace_ms=int(value.get("grace_ms", 0)),
            host_pid=int(value.get("host_pid", 0)),
            host_comm=value.get("host_comm"),
            root_exited=bool(value.get("root_exited", False)),
            state=str(value.get("state", "live")),
            member_count=int(value.get("member_count", 0)),
            members=[Member.from_json(m) for m in value.get("members", [])],
            members_truncated=bool(value.get("members_truncated", False)),
            nested_in=None if nested_in is None else int(nested_in),
        )


@dataclass(frozen=True)
class Event:
    """An event line. `kind` is one of `EventKind`: `registered`, `root_exited`,
    `kill_started`, `tree_empty`, `kill_failed`, `released`, `fork`, `exec`, `exit`,
    `dropped` (then `count` events were lost here, by the daemon or by this library's bounded
    queue), `closing` (the daemon's last line before it closes the connection; `reason`:
    `shutdown`, `hand_over` or `not_reading`) or `refused` (a request another process sent on
    this lease's connection was refused: `pid`, `code`, `line`; the lease goes on); the other
    fields are set where the kind has them."""

    kind: str
    tree: int
    lease: int
    pid: Optional[int] = None
    parent: Optional[int] = None
    comm: Optional[str] = None
    reason: Optional[str] = None
    count: Optional[int] = None
    kill: Optional[KillSummary] = None
    code: Optional[str] = None
    line: Optional[str] = None

    @classmethod
    def from_json(cls, value: Json) -> Event:
        def optional_int(name: str) -> Optional[int]:
            v = value.get(name)
            return None if v is None else int(v)

        def optional_str(name: str) -> Optional[str]:
            v = value.get(name)
            return None if v is None else str(v)

        kill = value.get("kill")
        return cls(
            kind=str(value["kind"]),
            tree=int(value.get("tree", 0)),
            lease=int(value.get("lease", 0)),
            pid=optional_int("pid"),
            parent=optional_int("parent"),
            comm=value.get("comm"),
            reason=value.get("reason"),
            count=optional_int("count"),
            kill=KillSummary.from_json(kill) if isinstance(kill, dict) else None,
            code=optional_str("code"),
            line=optional_str("line"),
        )

    @classmethod
    def dropped(cls, count: int) -> Event:
        return cls(kind="dropped", tree=0, lease=0, count=count)


@dataclass(frozen=True)
class LeaseInfo:
    id: int
    token: str


class ProtocolError(LeashError):
    """The daemon sent something this library does not understand: `what` says how, and
    `line` is the line, when a whole line was not understood (the connection then ends)."""

    def __init__(self, what: str, line: Optional[bytes] = None) -> None:
        quoted = "" if line is None else f": {quote_line(line)}"
        super().__init__(f"the leash daemon sent something unexpected: {what}{quoted}", "protocol")
        self.what = what
        self.line = line


# What a line from the daemon is: a reply to request `id` (its `ok` value, or the exception for
# its `error`), an event, or an error that answers no request (the daemon refused the
# connection, e.g. too many open, and closes it).
Reply = Tuple[int, Union[Any, LeashError]]


def decode_line(line: bytes) -> Union[Reply, Event, LeashError]:
    """Decodes one line from the daemon; raises ProtocolError for one it cannot make out."""
    try:
        value = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON ({e})", line) from None
    if not isinstance(value, dict):
        raise ProtocolError("not an object", line)
    try:
        if "event" in value:
            return Event.from_json(value["event"])
        request_id = value.get("id")
        if "error" in value:
            error = value["error"]
            failure = from_daemon(str(error.get("code", "failed")), str(error.get("message", "")))
            return failure if request_id is None else (int(request_id), failure)
        if request_id is not None and "ok" in value:
            return int(request_id), value["ok"]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"{e!r}", line) from None
    raise ProtocolError("neither a reply nor an event", line)


def result(ok: Any, key: str) -> Any:
    """The `key` of an `ok` reply value ({"hello": {...}} and the like)."""
    if isinstance(ok, dict) and key in ok:
        return ok[key]
    raise ProtocolError(f"expected a {key!r} reply, got {ok!r:.200}")


def parse_hello(ok: Any) -> LeaseInfo:
    try:
        lease = result(ok, "hello")["lease"]
        return LeaseInfo(id=int(lease["id"]), token=str(lease["token"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a hello reply without a lease ({e!r}): {ok!r:.200}") from None


def parse_registered(ok: Any) -> int:
    try:
        return int(result(ok, "registered")["tree"])
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a registered reply without a tree ({e!r}): {ok!r:.200}") from None


def parse_killed(ok: Any) -> KillSummary:
    try:
        return KillSummary.from_json(result(ok, "killed"))
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"a malformed killed reply ({e!r}): {ok!r:.200}") from None


def parse_trees(ok: Any) -> List[Tree]:
    try:
        return [Tree.from_json(t) for t in result(ok, "trees")]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ProtocolError(f"a malformed list reply ({e!r}): {ok!r:.200}") from None


def register_fields(pid: int, grace: Optional[float], keep_on_root_exit: bool) -> Dict[str, Any]:
    return {
        "pid": pid,
        "grace_ms": grace_ms(grace),
        "on_root_exit": "keep" if keep_on_root_exit else "kill",
    }
