"""Naming a running process to the daemon by a pidfd (`adopt`): right in any pid namespace,
where a pid is a number of the host's own, which from a container would name some other
process of the daemon's. The pidfd travels beside the request's line (SCM_RIGHTS), on one short
connection of its own that registers the process under the lease by the lease's token: the
lease's own connections write through buffered streams (asyncio's above all) that cannot carry
a descriptor with a line."""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, Optional

from .errors import LeashError, cannot_connect, connection_ended
from .protocol import PROTOCOL_VERSION, Event, ProtocolError, decode_line, encode

# How long the daemon may take to answer; a registration's /proc walk takes milliseconds.
TIMEOUT = 60.0
# The longest reply line read (a registration's reply is a few dozen bytes).
MAX_REPLY = 64 * 1024


def open_pidfd(pid: int) -> Optional[int]:
    """A pidfd for process `pid`; None where none can be had (no such process, a thread's id,
    a kernel before 5.3): the daemon is then asked by pid, and answers in its words."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def register_pidfd(path: str, token: str, pidfd: int, fields: Dict[str, Any]) -> Any:
    """Registers the process of `pidfd` under the lease whose token is `token`; returns the
    reply's `ok` value, or raises the daemon's error."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(path)
        except OSError as e:
            raise cannot_connect(path, e) from None
        try:
            with sock.makefile("rb") as replies:
                sock.sendall(encode(1, "hello", protocol=PROTOCOL_VERSION))
                _reply_to(1, replies, path)
                line = encode(2, "register", pidfd=True, lease=token, **fields)
                sent = socket.send_fds(sock, [line], [pidfd])
                sock.sendall(line[sent:])
                return _reply_to(2, replies, path)
        except OSError as e:
            raise connection_ended(path, None, f"registering by pidfd: {e}") from None


def _reply_to(request_id: int, replies: Any, path: str) -> Any:
    """The `ok` value of the reply to `request_id`; events before it are skipped (a `closing`
    one says why the connection then ends)."""
    closing = None
    while True:
        line = replies.readline(MAX_REPLY)
        if not line.endswith(b"\n"):
            raise connection_ended(path, closing, "the daemon closed the connection")
        decoded = decode_line(line)
        if isinstance(decoded, Event):
            if decoded.kind == "closing":
                closing = decoded.reason or "no reason given"
            continue
        if isinstance(decoded, LeashError):
            raise decoded
        if isinstance(decoded, tuple):
            answered, value = decoded
            if answered != request_id:
                raise ProtocolError(f"a reply to {answered} while waiting for {request_id}", line)
            if isinstance(value, LeashError):
                raise value
            return value
