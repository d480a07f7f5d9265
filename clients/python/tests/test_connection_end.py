"""What the library says when the daemon ends the connection, and what it makes of lines it
did not ask for, against a scripted stand-in for the daemon: the `closing` event's reason
(what became of the lease's trees), a `refused` event (logged; the lease goes on), and a line
it cannot read (the lease ends, and the error says which line and what the daemon does)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import BinaryIO, Callable, List, Optional

import pytest
from fake_daemon import FakeDaemon, Handler, closing, event, hello, receive, registering_shim, send

import leash

Fake = Callable[[List[Handler]], FakeDaemon]

# What each ending says, in part; the reason the error carries.
ENDINGS = [
    ("shutdown", "stopped (shutdown): it killed this lease's trees"),
    ("hand_over", "handed its trees over to the next daemon: they stay enforced"),
    ("not_reading", "more than 128 KiB of replies and events unread, so the lease ended and"),
    (None, "closed without a reason (the daemon closed the connection): the daemon kills"),
]


def ends_with(reason: Optional[str]) -> Handler:
    """A daemon that takes a request, and instead of an answer closes the connection, with
    its `closing` event if `reason` is given."""

    def serve(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 7)
        receive(reader)
        closing(writer, 7, reason)

    return serve


@pytest.mark.parametrize(("reason", "words"), ENDINGS)
def test_the_error_says_why_the_connection_ended(
    fake: Fake, reason: Optional[str], words: str
) -> None:
    daemon = fake([ends_with(reason)])
    with leash.Lease(socket=daemon.path) as lease:
        with pytest.raises(leash.ConnectionLost) as raised:
            lease.trees()
    assert raised.value.reason == reason
    assert raised.value.code == "unavailable"
    assert isinstance(raised.value, leash.Unavailable)
    assert words in str(raised.value), str(raised.value)
    assert daemon.path in str(raised.value)


@pytest.mark.parametrize(("reason", "words"), ENDINGS)
def test_asyncio_the_error_says_why_the_connection_ended(
    fake: Fake, reason: Optional[str], words: str
) -> None:
    daemon = fake([ends_with(reason)])

    async def host() -> leash.ConnectionLost:
        async with leash.AsyncLease(socket=daemon.path) as lease:
            with pytest.raises(leash.ConnectionLost) as raised:
                await lease.trees()
            return raised.value

    error = asyncio.run(host())
    assert error.reason == reason and words in str(error), str(error)


def test_an_event_stream_ends_with_why(fake: Fake) -> None:
    def serve(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 7)
        subscribe = receive(reader)
        send(writer, {"id": subscribe["id"], "ok": {"subscribed": {}}})
        event(writer, "tree_empty", 7)
        closing(writer, 7, "hand_over")

    daemon = fake([serve])
    with leash.Lease(socket=daemon.path) as lease:
        stream = lease.events()
        first = stream.get(60)
        assert first is not None and first.kind == "tree_empty"
        closed = stream.get(60)  # the closing event itself, then the end
        assert closed is not None and closed.kind == "closing" and closed.reason == "hand_over"
        with pytest.raises(leash.ConnectionLost, match="handed its trees over") as raised:
            stream.get(60)
        assert raised.value.reason == "hand_over"


REFUSED_LINE = '{"id":2,"op":"release","tree":3}'


def refuses_a_stranger(reader: BinaryIO, writer: BinaryIO) -> None:
    """Answers two lists; before the first answer, says it refused a request that another
    process sent on the connection."""
    hello(reader, writer, 7)
    for _ in range(2):
        listing = receive(reader)
        if listing["id"] == 2:
            event(writer, "refused", 7, pid=4300, code="permission_denied", line=REFUSED_LINE)
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
    reader.read()


def check_refusal_logged(caplog: pytest.LogCaptureFixture) -> None:
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "leash"]
    assert len(said) == 1, said
    level, message = said[0]
    assert level == logging.WARNING
    assert "process 4300" in message and REFUSED_LINE in message, message
    assert "permission_denied" in message and "the lease goes on" in message


def test_a_refused_request_of_another_process_is_logged_and_the_lease_goes_on(
    fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="leash")
    daemon = fake([refuses_a_stranger])
    with leash.Lease(socket=daemon.path) as lease:
        assert lease.trees() == []
        assert lease.trees() == []
        assert lease.leashed and lease.lease_id == 7
    check_refusal_logged(caplog)


def test_asyncio_a_refused_request_is_logged_and_the_lease_goes_on(
    fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="leash")
    daemon = fake([refuses_a_stranger])

    async def host() -> None:
        async with leash.AsyncLease(socket=daemon.path) as lease:
            assert await lease.trees() == []
            assert await lease.trees() == []
            assert lease.leashed and lease.lease_id == 7

    asyncio.run(host())
    check_refusal_logged(caplog)


# Longer than an error quotes: the first 200 bytes are shown, not what follows.
LONG_GARBAGE = b"<" + b"x" * 198 + b"|NOT-SHOWN|" + b"y" * 100 + b">"


@pytest.mark.parametrize(
    ("line", "what"),
    [
        (LONG_GARBAGE, "not JSON"),
        (b'{"id":99,"ok":{"trees":[]}}', "a reply to request 99, which is not pending"),
        (b'{"something":"else"}', "neither a reply nor an event"),
    ],
)
def test_a_line_not_understood_ends_the_lease_and_says_which(
    fake: Fake, tmp_path: Path, line: bytes, what: str
) -> None:
    def first(reader: BinaryIO, writer: BinaryIO) -> None:
        hello(reader, writer, 7)
        receive(reader)  # a list, answered with the line
        writer.write(line + b"\n")
        writer.flush()
        reader.read()

    def second(reader: BinaryIO, writer: BinaryIO) -> None:
        # close() asks what is left of the tree from before; nothing is.
        hello(reader, writer, 8)
        listing = receive(reader)
        send(writer, {"id": listing["id"], "ok": {"trees": []}})
        reader.read()

    daemon = fake([first, second])
    with leash.Lease(socket=daemon.path, leash=registering_shim(tmp_path)) as lease:
        proc = lease.popen(["true"])
        assert proc.tree == 8
        with pytest.raises(leash.ConnectionLost) as raised:
            lease.trees()
        assert proc.wait(60) == 0
    message = str(raised.value)
    assert raised.value.reason == "protocol"
    assert what in message, message
    assert repr(line[:200]) in message, message
    assert b"NOT-SHOWN" not in line[:200] and "NOT-SHOWN" not in message
    assert "the daemon kills this lease's 1 tree, since the lease ended" in message
