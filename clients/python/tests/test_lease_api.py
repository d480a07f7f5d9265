"""The lease's own checks and words, with no daemon or a scripted stand-in: the grace (seconds,
checked at once), a closed lease (LeaseClosed), the one warning of a lease that falls back to
running unleashed when the daemon goes away, and what a command that cannot be executed
raises (from the shim's report)."""

from __future__ import annotations

import asyncio
import errno
import json
import math
from pathlib import Path
from typing import BinaryIO, Callable, List

import pytest
from conftest import wait_until
from fake_daemon import FakeDaemon, Handler, hello, registering_shim

import leash
from leash import _shim

Fake = Callable[[List[Handler]], FakeDaemon]


@pytest.mark.parametrize("grace", [-0.001, math.nan, math.inf, -math.inf, 600.5, 1e9])
def test_a_grace_out_of_range_is_refused_at_once(tmp_path: Path, grace: float) -> None:
    # No daemon at the socket: the grace is checked before any connection is tried.
    bogus = str(tmp_path / "none.sock")
    with pytest.raises(ValueError, match="grace must be a number of seconds from 0 to 600"):
        leash.Lease(socket=bogus, grace=grace)
    with pytest.raises(ValueError, match="from 0 to 600"):
        leash.AsyncLease(socket=bogus, grace=grace)


def test_a_grace_is_seconds(tmp_path: Path) -> None:
    assert _shim.Spawn.of(["x"], False, None, False, {}).grace_ms is None
    for seconds, ms in [(0, 0), (0.25, 250), (2, 2000), (600, 600_000)]:
        assert leash.protocol.grace_ms(seconds) == ms
    with pytest.raises(TypeError, match="seconds"):
        leash.protocol.grace_ms("2s")  # type: ignore[arg-type]


def idle(reader: BinaryIO, writer: BinaryIO) -> None:
    hello(reader, writer, 7)
    reader.read()


def test_a_closed_lease_raises_lease_closed(fake: Fake, tmp_path: Path) -> None:
    daemon = fake([idle])
    lease = leash.Lease(socket=daemon.path, leash=registering_shim(tmp_path))
    lease.close()
    lease.close()  # again: nothing to do
    with pytest.raises(leash.LeaseClosed, match="this lease is closed") as raised:
        lease.popen(["true"])
    assert raised.value.code == "closed" and isinstance(raised.value, leash.LeashError)
    with pytest.raises(leash.LeaseClosed):
        lease.trees()


def test_asyncio_a_closed_lease_raises_lease_closed(fake: Fake) -> None:
    daemon = fake([idle])

    async def host() -> None:
        lease = await leash.AsyncLease.connect(socket=daemon.path)
        await lease.aclose()
        with pytest.raises(leash.LeaseClosed):
            await lease.trees()

    asyncio.run(host())


def test_a_lease_whose_daemon_went_away_warns_once_at_the_callers_line(
    fake: Fake, tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    def goes_away(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 7)

    daemon = fake([goes_away])
    with leash.Lease(socket=daemon.path, leash=registering_shim(tmp_path), optional=True) as lease:
        daemon.stop_accepting()
        # The connection ends; the next spawns find no daemon to connect to.
        assert wait_until(lambda: not lease.leashed)
        first = lease.popen(["true"])
        second = lease.popen(["true"])
        assert first.leash_tree is None and second.leash_tree is None
        assert first.wait(60) == 0 and second.wait(60) == 0
    warned = [w for w in recwarn if issubclass(w.category, leash.UnleashedWarning)]
    assert len(warned) == 1, [str(w.message) for w in warned]
    assert warned[0].filename == __file__
    assert f"'true' (pid {first.pid}) runs UNLEASHED" in str(warned[0].message)


def status(*reports: object) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in reports)


REGISTERED = {"registered": {"tree": 8, "root": 4242}}


def test_exec_failures_raise_as_popen_does() -> None:
    missing = _shim.parse_status(
        status(REGISTERED, {"exec_failed": {"errno": errno.ENOENT, "message": "executing"}}),
        "my-agent",
    )
    assert isinstance(missing.error, FileNotFoundError)
    assert missing.error.filename == "my-agent" and missing.error.errno == errno.ENOENT
    assert "command not found" in str(missing.error)

    for code in (errno.EACCES, errno.ENOEXEC):
        report = {"exec_failed": {"errno": code, "message": "executing"}}
        denied = _shim.parse_status(status(REGISTERED, report), b"./my-agent")
        assert isinstance(denied.error, PermissionError), code
        assert denied.error.errno == code and denied.error.filename == "./my-agent"
        assert "not executable" in str(denied.error)

    other = _shim.parse_status(
        status(REGISTERED, {"exec_failed": {"errno": errno.E2BIG, "message": "executing"}}), "a"
    )
    assert type(other.error) is OSError and other.error.errno == errno.E2BIG
    wordless = _shim.parse_status(
        status(REGISTERED, {"exec_failed": {"message": "executing a: it failed"}}), "a"
    )
    assert isinstance(wordless.error, OSError) and "it failed" in str(wordless.error)
