"""A scripted stand-in for the daemon, for the tests of what the real one cannot be made to do
on cue (answer out of order, vanish, send a line of its choosing), and a stand-in for
`leash exec` that registers every command as tree 8."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, List, Optional

Handler = Callable[[BinaryIO, BinaryIO], None]


class FakeDaemon:
    """Accepts connections on a socket; the n-th is served by handlers[n] (reading requests
    from its first argument, writing lines to its second), then closed."""

    def __init__(self, path: Path, handlers: List[Handler]) -> None:
        self.path = str(path)
        self._handlers = handlers
        self._server = socket.socket(socket.AF_UNIX)
        self._server.bind(self.path)
        self._server.listen()
        self._threads: List[threading.Thread] = []
        self.errors: List[BaseException] = []
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        for handler in self._handlers:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(connection, handler), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, connection: socket.socket, handler: Handler) -> None:
        with connection, connection.makefile("rb") as reader, connection.makefile("wb") as writer:
            try:
                handler(reader, writer)
            except BaseException as e:  # shown by close()
                self.errors.append(e)

    def stop_accepting(self) -> None:
        """No daemon at the socket from now on: a connection is refused."""
        self._server.close()

    def close(self) -> None:
        self._server.close()
        for thread in self._threads:
            thread.join(60)
        assert not self.errors, self.errors


def receive(reader: BinaryIO) -> Dict[str, Any]:
    line = reader.readline()
    assert line, "the client closed the connection"
    request = json.loads(line)
    assert isinstance(request, dict)
    return request


def send(writer: BinaryIO, message: Dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    writer.flush()


def hello(reader: BinaryIO, writer: BinaryIO, lease_id: int) -> None:
    request = receive(reader)
    assert request["op"] == "hello" and request["protocol"] == 1
    lease = {"id": lease_id, "token": f"token{lease_id}"}
    send(writer, {"id": request["id"], "ok": {"hello": {"protocol": 1, "lease": lease}}})


def answer_kill(
    writer: BinaryIO, kill: Dict[str, Any], terminated: int = 0, killed: int = 0, rounds: int = 0
) -> None:
    """Answers a kill request as the daemon does once the tree is empty."""
    summary = {
        "tree": kill["tree"],
        "terminated": terminated,
        "killed": killed,
        "rounds": rounds,
        "elapsed_ms": 1,
        "reason": "request",
    }
    send(writer, {"id": kill["id"], "ok": {"killed": summary}})


def event(writer: BinaryIO, kind: str, lease: int, **fields: Any) -> None:
    send(writer, {"event": {"kind": kind, "tree": 0, "lease": lease, **fields}})


def closing(writer: BinaryIO, lease: int, reason: Optional[str]) -> None:
    """The daemon's last line before it closes the connection (none if `reason` is None)."""
    if reason is not None:
        event(writer, "closing", lease, reason=reason)


REGISTERING_SHIM = """#!{python}
# leash exec as a stand-in: registers any command as tree 8, then runs it.
import json, os, sys
args = sys.argv[1:]
lease_fd = int(args[args.index("--lease-fd") + 1])
status_fd = int(args[args.index("--status-fd") + 1])
command = args[args.index("--") + 1:]
os.read(lease_fd, 256)
os.close(lease_fd)
registered = {{"registered": {{"tree": 8, "root": os.getpid()}}}}
os.write(status_fd, json.dumps(registered).encode() + b"\\n")
os.execvp(command[0], command)
"""


def registering_shim(directory: Path) -> str:
    shim = directory / "leash"
    shim.write_text(REGISTERING_SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    return str(shim)
