"""How the library handles the connection itself, against a scripted stand-in for the daemon
(the real one cannot be made to answer out of order or vanish on cue from here): replies matched
to requests by id whatever their order, a lost connection that fails what waits with
Unavailable and is made again by the next call, and the daemon's last word before it closes."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Tuple

import pytest

import leash

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


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[[List[Handler]], FakeDaemon]]:
    made: List[FakeDaemon] = []

    def start(handlers: List[Handler]) -> FakeDaemon:
        made.append(FakeDaemon(tmp_path / f"fake{len(made)}.sock", handlers))
        return made[-1]

    yield start
    for daemon in made:
        daemon.close()


def test_replies_out_of_order_reach_their_requests(
    fake: Callable[[List[Handler]], FakeDaemon],
) -> None:
    kill_received = threading.Event()

    def serve(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 7)
        kill = receive(reader)
        assert kill["op"] == "kill" and kill["tree"] == 5
        kill_received.set()
        listing = receive(reader)
        assert listing["op"] == "list"
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
        answer_kill(writer, kill, terminated=1)
        reader.read()  # until the client closes

    daemon = fake([serve])
    with leash.Lease(socket=daemon.path) as lease:
        results: List[leash.KillSummary] = []
        killer = threading.Thread(target=lambda: results.append(lease.kill(5)))
        killer.start()
        assert kill_received.wait(60)
        assert lease.trees() == []  # answered while the kill waits
        killer.join(60)
        assert results and results[0].tree == 5 and results[0].reason == "request"


def test_a_lost_connection_fails_what_waits_and_the_next_call_connects_again(
    fake: Callable[[List[Handler]], FakeDaemon],
) -> None:
    def first(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 1)
        receive(reader)  # a list, never answered: the daemon goes away

    def second(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 2)
        listing = receive(reader)
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
        reader.read()

    daemon = fake([first, second])
    with leash.Lease(socket=daemon.path) as lease:
        assert lease.lease_id == 1
        with pytest.raises(leash.Unavailable) as raised:
            lease.trees()
        message = str(raised.value)
        assert "lost the connection" in message
        assert "stay enforced by the daemon that takes over" in message
        assert not lease.leashed
        assert lease.trees() == []
        assert lease.lease_id == 2 and lease.leashed


def test_the_daemons_last_word_is_the_error(fake: Callable[[List[Handler]], FakeDaemon]) -> None:
    words = "uid 61001 has 128 connections open, the most allowed; close some first"

    def refuse(reader: BinaryIO, writer: BinaryIO) -> None:
        send(writer, {"error": {"code": "limit_reached", "message": words}})

    daemon = fake([refuse])
    with pytest.raises(leash.LimitReached) as raised:
        leash.Lease(socket=daemon.path)
    assert raised.value.message == words and raised.value.code == "limit_reached"


def test_asyncio_a_lost_connection_and_out_of_order_replies(
    fake: Callable[[List[Handler]], FakeDaemon],
) -> None:
    kill_received = threading.Event()

    def first(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 1)
        kill = receive(reader)
        kill_received.set()
        listing = receive(reader)
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
        answer_kill(writer, kill, killed=1, rounds=1)
        receive(reader)  # never answered: the daemon goes away

    def second(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 2)
        listing = receive(reader)
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
        reader.read()

    daemon = fake([first, second])

    async def host() -> None:
        async with leash.AsyncLease(socket=daemon.path) as lease:
            kill = asyncio.ensure_future(lease.kill(9))
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, kill_received.wait, 60)
            assert await lease.trees() == []
            assert (await kill).killed == 1
            with pytest.raises(leash.Unavailable, match="stay enforced"):
                await lease.trees()
            assert await lease.trees() == [] and lease.lease_id == 2

    asyncio.run(host())


FAKE_SHIM = """#!{python}
# leash exec as a stand-in: refuses the first lease's token as unknown (as a daemon that
# restarted does), registers under any other.
import json, os, sys
args = sys.argv[1:]
lease_fd = int(args[args.index("--lease-fd") + 1])
status_fd = int(args[args.index("--status-fd") + 1])
command = args[args.index("--") + 1:]
token = os.read(lease_fd, 256).decode().strip()
os.close(lease_fd)
with open(os.environ["FAKE_SHIM_LOG"], "a") as log:
    log.write(token + "\\n")
if token == "token1":
    refusal = {{"error": {{"code": "not_found", "message": "no lease with that token"}}}}
    os.write(status_fd, json.dumps(refusal).encode() + b"\\n")
    sys.exit(125)
registered = {{"registered": {{"tree": 8, "root": os.getpid()}}}}
os.write(status_fd, json.dumps(registered).encode() + b"\\n")
os.execvp(command[0], command)
"""


def restarted_daemon(shim_log: Path) -> List[Handler]:
    """A daemon whose first connection ends once the shim has been refused on its token (the
    host's connection to the old daemon, found closed a moment late), and whose second one
    takes the kill of tree 8 when the lease closes."""

    def first(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 1)
        deadline = time.monotonic() + 60
        while "token1" not in (shim_log.read_text() if shim_log.exists() else ""):
            assert time.monotonic() < deadline, "the shim never ran"
            time.sleep(0.01)

    def second(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 2)
        kill = receive(reader)
        assert kill["op"] == "kill" and kill["tree"] == 8, kill
        answer_kill(writer, kill)
        reader.read()

    return [first, second]


@pytest.fixture
def fake_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tuple[str, Path]:
    shim = tmp_path / "leash"
    shim.write_text(FAKE_SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    log = tmp_path / "shim.log"
    monkeypatch.setenv("FAKE_SHIM_LOG", str(log))
    return str(shim), log


def test_a_spawn_refused_for_a_stale_token_goes_again_on_a_new_lease(
    fake: Callable[[List[Handler]], FakeDaemon], fake_shim: Tuple[str, Path]
) -> None:
    shim, log = fake_shim
    daemon = fake(restarted_daemon(log))
    with leash.Lease(socket=daemon.path, leash=shim) as lease:
        proc = lease.popen(["true"])
        assert proc.leash_tree == 8 and lease.lease_id == 2
        assert proc.wait(timeout=60) == 0
    assert log.read_text().split() == ["token1", "token2"]


def test_asyncio_a_spawn_refused_for_a_stale_token_goes_again_on_a_new_lease(
    fake: Callable[[List[Handler]], FakeDaemon], fake_shim: Tuple[str, Path]
) -> None:
    shim, log = fake_shim
    daemon = fake(restarted_daemon(log))

    async def host() -> None:
        async with leash.AsyncLease(socket=daemon.path, leash=shim) as lease:
            proc = await lease.create_subprocess_exec("true")
            assert leash.tree_of(proc) == 8 and lease.lease_id == 2
            assert await proc.wait() == 0

    asyncio.run(host())
    assert log.read_text().split() == ["token1", "token2"]
