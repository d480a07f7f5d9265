"""What a host is told when the real daemon stops: a daemon of the test's own (its own socket
and pins), stopped with SIGTERM (shutdown: it kills every tree) or SIGHUP (a hand-over: it
leaves the trees to the next daemon, which enforces them). The lease's event stream ends with
a ConnectionLost that says which, and the trees are as it says."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest
from conftest import DEADLINE, Cgroup, alive, required_env, wait_until

import leash

# Where a test daemon pins its programs and maps: removed afterwards, whatever happened.
BPFFS = Path("/sys/fs/bpf")


class OwnDaemon:
    """`leash daemon` on a socket and pins of its own; `stop` sends a signal and waits."""

    _next = itertools.count()

    def __init__(self) -> None:
        # Short: a socket's path has at most 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="leash-own-"))
        self.socket = str(self.dir / "leash.sock")
        self.pins = BPFFS / f"leash-pytest-{os.getpid()}-{next(self._next)}"
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.start()

    def start(self) -> None:
        """Starts the daemon (again, after a hand-over: it takes the pinned trees over)."""
        with open(self.dir / "daemon.log", "ab") as log:
            self.process = subprocess.Popen(
                [required_env("LEASH_BIN"), "daemon", "--socket", self.socket]
                + ["--pin-dir", str(self.pins)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "LEASH_LOG": "info"},
            )
        if not wait_until(self._serving, DEADLINE):
            pytest.fail(f"the daemon did not start; its log:\n{self.log()}")

    def _serving(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"the daemon exited ({self.process.returncode}):\n{self.log()}")
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(self.socket)
                return True
            except OSError:
                return False

    def stop(self, signum: int) -> None:
        """Sends `signum` and waits for the daemon to exit cleanly."""
        assert self.process is not None
        self.process.send_signal(signum)
        try:
            code = self.process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the daemon did not exit on signal {signum}:\n{self.log()}")
        assert code == 0, f"the daemon exited {code}:\n{self.log()}"

    def log(self) -> str:
        try:
            return (self.dir / "daemon.log").read_text()
        except OSError:
            return ""

    def remove(self) -> None:
        """Stops the daemon if it runs (SIGTERM: it kills its trees and removes its pins),
        removes pins a hand-over left (which detaches the programs), and the directory."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.pins, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def own_daemon() -> Iterator[Callable[[], OwnDaemon]]:
    made: List[OwnDaemon] = []

    def start() -> OwnDaemon:
        made.append(OwnDaemon())
        return made[-1]

    try:
        yield start
    finally:
        for daemon in made:
            daemon.remove()


def end_of(stream: leash.EventStream) -> leash.ConnectionLost:
    """Reads `stream` to its end: the ConnectionLost it ends with."""
    deadline = time.monotonic() + DEADLINE
    seen: List[str] = []
    while True:
        try:
            event = stream.get(max(deadline - time.monotonic(), 0))
        except leash.ConnectionLost as lost:
            return lost
        if event is None:
            pytest.fail(f"the stream did not end with ConnectionLost; events: {seen}")
        seen.append(event.kind)


def test_a_host_is_told_what_became_of_its_trees_when_the_daemon_stops(
    own_daemon: Callable[[], OwnDaemon], cgroups: Callable[[str], Cgroup]
) -> None:
    # One daemon, started twice (a start loads the programs: seconds on a busy machine).
    daemon = own_daemon()

    # A hand-over (SIGHUP): the tree lives on, and the next daemon enforces it.
    kept = cgroups("hand-over")
    with leash.Lease(socket=daemon.socket) as lease:
        stream = lease.events()
        agent = lease.popen(kept.wrap(["sleep", "600"]))
        assert wait_until(lambda: kept.procs() == {agent.pid})
        daemon.stop(signal.SIGHUP)
        lost = end_of(stream)
        assert lost.reason == "hand_over", f"{lost} (the daemon's log:\n{daemon.log()})"
        assert "handed its trees over to the next daemon: they stay enforced" in str(lost)
        assert alive(agent.pid)
        # The next daemon takes the tree over; closing the lease (a new one) kills it.
        daemon.start()
    assert agent.wait(DEADLINE) == -signal.SIGTERM
    assert kept.wait_empty()

    # A shutdown (SIGTERM): the daemon kills the tree, and says so.
    killed = cgroups("shutdown")
    lease = leash.Lease(socket=daemon.socket)
    try:
        stream = lease.events()
        agent = lease.popen(killed.wrap(["sleep", "600"]))
        assert wait_until(lambda: killed.procs() == {agent.pid})
        daemon.stop(signal.SIGTERM)
        lost = end_of(stream)
        assert lost.reason == "shutdown", f"{lost} (the daemon's log:\n{daemon.log()})"
        assert "stopped (shutdown): it killed this lease's trees" in str(lost)
        assert agent.wait(DEADLINE) == -signal.SIGTERM
        assert killed.wait_empty()
    finally:
        # No daemon runs: close() finds none to ask about the tree, which is gone.
        with contextlib.suppress(leash.Unavailable):
            lease.close()
