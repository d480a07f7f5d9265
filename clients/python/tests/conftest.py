"""Shared pieces of the leash host library's tests. They run against the real daemon (its socket
in LEASH_SOCKET, its binary in LEASH_BIN), as root, and compare with a cgroup v2 group of their
own, which the kernel keeps exact: the ground truth for "every process of this tree".

tests/tests/host_python.rs starts the daemon (with --max-trees-per-uid LEASH_TEST_MAX_TREES)
and runs them; `cargo xtask test` runs that.
"""

from __future__ import annotations

import itertools
import os
import select
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, List, Optional, Sequence, Set

import pytest
from fake_daemon import FakeDaemon, Handler

import leash

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"
# The interpreter other users can run (a pyenv one under /root is not theirs to read).
SYSTEM_PYTHON = "/usr/bin/python3"
# Generous: the machine that runs these may be slow and busy.
DEADLINE = 60.0


def required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: these tests run against a real leash daemon; run them with "
            "`cargo test -p leash-tests --test host_python` (or `cargo xtask test`), which "
            "starts one",
            pytrace=False,
        )
    return value


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE) -> bool:
    """Polls `condition` every 10 ms until it holds or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def cgroup2_root() -> Path:
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            mount, _, filesystem = line.partition(" - ")
            if filesystem.split(" ")[0] == "cgroup2":
                return Path(mount.split(" ")[4].replace("\\040", " "))
    pytest.fail("no cgroup2 file system is mounted: the tests use cgroup v2 as ground truth")


class Cgroup:
    """A cgroup v2 group of the test's own: what runs in it, and everything that forks from
    it, is in `procs()` until it exits. `destroy()` kills what is left and removes it."""

    _next = itertools.count()

    def __init__(self, label: str) -> None:
        self.path = cgroup2_root() / f"leash-pytest-{os.getpid()}-{label}-{next(self._next)}"
        self.path.mkdir()

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def procs(self) -> Set[int]:
        return {int(p) for p in (self.path / "cgroup.procs").read_text().split()}

    def populated(self) -> bool:
        return "populated 1" in (self.path / "cgroup.events").read_text()

    def wrap(self, argv: Sequence[str], uid: Optional[int] = None) -> List[str]:
        """A command that joins this group, then (as `uid`, if given) execs `argv`: nothing of
        it runs outside the group."""
        setpriv = [] if uid is None else setpriv_args(uid)
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', self.procs_file, *setpriv, *argv]

    def wait_empty(self, timeout: float = DEADLINE) -> bool:
        return wait_until(lambda: not self.populated(), timeout)

    def destroy(self) -> None:
        try:
            (self.path / "cgroup.kill").write_text("1")
            self.wait_empty(10)
            self.path.rmdir()
        except FileNotFoundError:
            pass


def setpriv_args(uid: int) -> List[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


@pytest.fixture(scope="session", autouse=True)
def daemon_env() -> None:
    """Fails every test, saying why, when no daemon was started for them."""
    required_env("LEASH_SOCKET")
    required_env("LEASH_BIN")
    if not os.path.exists(os.environ["LEASH_SOCKET"]):
        pytest.fail(f"no leash daemon socket at {os.environ['LEASH_SOCKET']}", pytrace=False)


@pytest.fixture
def cgroups() -> Iterator[Callable[[str], Cgroup]]:
    """Makes cgroups; every one is emptied and removed after the test, however it ends."""
    made: List[Cgroup] = []

    def make(label: str) -> Cgroup:
        made.append(Cgroup(label))
        return made[-1]

    try:
        yield make
    finally:
        for cgroup in made:
            cgroup.destroy()


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[[List[Handler]], FakeDaemon]]:
    """Starts scripted stand-ins for the daemon (see fake_daemon.py), closed after the test."""
    made: List[FakeDaemon] = []

    def start(handlers: List[Handler]) -> FakeDaemon:
        made.append(FakeDaemon(tmp_path / f"fake{len(made)}.sock", handlers))
        return made[-1]

    yield start
    for daemon in made:
        daemon.close()


@pytest.fixture
def lease() -> Iterator[leash.Lease]:
    with leash.Lease() as lease:
        yield lease


@pytest.fixture
def test_user() -> int:
    return int(required_env("LEASH_TEST_USER"))


@pytest.fixture(scope="session")
def for_anyone() -> Iterator[Path]:
    """A directory any user can read, with a copy of the leash package, the examples and the
    test agents: what the tests run as an unprivileged user."""
    root = Path(tempfile.mkdtemp(prefix="leash-pytest-"))
    try:
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(Path(leash.__file__).parent, root / "leash", ignore=ignore)
        shutil.copytree(EXAMPLES, root / "examples", ignore=ignore)
        shutil.copytree(HERE / "agents", root / "agents", ignore=ignore)
        for directory, _, files in os.walk(root):
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(os.path.join(directory, name), 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def user_dir(test_user: int) -> Iterator[Path]:
    """A scratch directory of the unprivileged user's own."""
    path = Path(tempfile.mkdtemp(prefix="leash-pytest-user-"))
    os.chown(path, test_user, test_user)
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def user_env(for_anyone: Path, home: Path) -> Dict[str, str]:
    """The environment of a Python host run as the unprivileged user, with the package copy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(for_anyone), HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return env


class Lines:
    """The lines a child writes on a pipe, read with a deadline."""

    def __init__(self, pipe: IO[bytes]) -> None:
        self._fd = pipe.fileno()
        self._buffer = b""
        self.seen: List[str] = []

    def until(self, predicate: Callable[[str], bool], timeout: float = DEADLINE) -> str:
        """Reads lines until one satisfies `predicate`, and returns it; fails the test, showing
        what came, if none does in time or the pipe ends first."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                self.seen.append(text)
                if predicate(text):
                    return text
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([self._fd], [], [], max(remaining, 0))
            if not ready:
                pytest.fail(f"no such line in {timeout} s; the lines so far: {self.seen}")
            chunk = os.read(self._fd, 65536)
            if not chunk:
                pytest.fail(f"the pipe ended with no such line; the lines: {self.seen}")
            self._buffer += chunk
