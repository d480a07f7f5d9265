"""How the library handles the connection itself, against a scripted stand-in for the daemon
(the real one cannot be made to answer out of order or vanish on cue from here): replies matched
to requests by id whatever their order, a lost connection that fails what waits with
Unavailable and is made again by the next call, and the daemon's last word before it closes."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import BinaryIO, Callable, List, Tuple

import pytest
from fake_daemon import FakeDaemon, Handler, answer_kill, hello, receive, send

import leash


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
        assert "closed without a reason" in message
        assert "unless it handed them over" in message
        assert raised.value.reason is None
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
            with pytest.raises(leash.ConnectionLost, match="closed without a reason"):
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
