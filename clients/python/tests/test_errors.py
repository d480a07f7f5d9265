"""Errors are exceptions in the daemon's words, raised at spawn time, never a child that exits
125: no daemon, no binary, a shim that cannot say, a per-uid limit, a permission; and the
explicit, loud fallback of `optional=True`."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from conftest import SYSTEM_PYTHON, Cgroup, Lines, required_env, user_env

import leash
from leash import _shim


def assert_says_how_to_start(error: leash.Unavailable) -> None:
    assert error.code == "unavailable"
    message = str(error)
    for advice in ("sudo systemctl start leash", "sudo leash daemon", "LEASH_SOCKET"):
        assert advice in message, f"{advice!r} is not in: {message}"


def test_no_daemon_is_unavailable_and_says_how_to_start_it(tmp_path: Path) -> None:
    bogus = tmp_path / "no-daemon.sock"
    with pytest.raises(leash.Unavailable) as raised:
        leash.Lease(socket=str(bogus))
    assert str(bogus) in str(raised.value)
    assert_says_how_to_start(raised.value)


def test_a_socket_nobody_listens_on_is_unavailable(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "dead.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))
    dead.close()  # bound, never listening: connecting is refused
    with pytest.raises(leash.Unavailable) as raised:
        leash.Lease(socket=str(path))
    assert_says_how_to_start(raised.value)


def test_no_leash_binary_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(leash.Unavailable) as raised:
        leash.Lease(leash=str(tmp_path / "leash"))
    assert "not an executable leash binary" in str(raised.value)

    monkeypatch.delenv("LEASH_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_shim, "PACKAGED_BINARY", str(tmp_path / "_bin" / "leash"))
    with pytest.raises(leash.Unavailable) as raised:
        leash.Lease()
    # Every place it looked, and the fixes.
    for place in ("LEASH_BIN", str(tmp_path / "_bin" / "leash"), "PATH", str(tmp_path), "wheel"):
        assert place in str(raised.value), f"{place!r} is not in: {raised.value}"


def fake_leash(path: Path, executable: bool = True) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755 if executable else 0o644)
    return str(path)


def test_the_leash_binary_is_the_option_then_leash_bin_then_the_packaged_one_then_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    option = fake_leash(tmp_path / "option" / "leash")
    from_env = fake_leash(tmp_path / "env" / "leash")
    packaged = fake_leash(tmp_path / "package" / "_bin" / "leash")
    on_path = fake_leash(tmp_path / "path" / "leash")
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    monkeypatch.setenv("LEASH_BIN", from_env)
    monkeypatch.setattr(_shim, "PACKAGED_BINARY", packaged)
    assert _shim.find_leash(option) == option
    assert _shim.find_leash(None) == from_env
    monkeypatch.delenv("LEASH_BIN")
    assert _shim.find_leash(None) == packaged
    # A packaged file that lost its executable bit is passed over (and named if nothing else
    # is found); so is a pure wheel's absent one.
    fake_leash(Path(packaged), executable=False)
    assert _shim.find_leash(None) == on_path
    monkeypatch.setattr(_shim, "PACKAGED_BINARY", str(tmp_path / "none" / "leash"))
    assert _shim.find_leash(None) == on_path
    fake_leash(Path(packaged), executable=False)
    monkeypatch.setattr(_shim, "PACKAGED_BINARY", packaged)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(leash.Unavailable, match=f"{packaged} is not executable"):
        _shim.find_leash(None)


def old_leash(tmp_path: Path) -> str:
    """A `leash` that knows nothing of --status-fd, as an old release would say."""
    script = tmp_path / "leash"
    script.write_text(
        "#!/bin/sh\necho \"error: unexpected argument '--status-fd' found\" >&2\nexit 2\n"
    )
    script.chmod(0o755)
    return str(script)


def test_a_shim_that_ends_without_a_word_is_an_error_not_a_child(tmp_path: Path) -> None:
    with leash.Lease(leash=old_leash(tmp_path)) as lease:
        with pytest.raises(leash.LeashError) as raised:
            lease.popen(["sleep", "600"], stderr=subprocess.PIPE)
        message = str(raised.value)
        assert "without a word" in message and "exit status 2" in message
        assert "unexpected argument '--status-fd'" in message
        # The user's own stderr is never read: the message points at it.
        with pytest.raises(leash.LeashError, match="standard error says why"):
            lease.popen(["sleep", "600"], stderr=subprocess.DEVNULL)


def test_optional_falls_back_with_one_warning_when_there_is_no_daemon(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, recwarn: pytest.WarningsRecorder
) -> None:
    bogus = str(tmp_path / "no-daemon.sock")
    caplog.set_level(logging.INFO, logger="leash")
    with leash.Lease(socket=bogus, optional=True) as lease:
        assert not lease.leashed and lease.lease_id is None
        procs = [
            lease.popen(["echo", "unleashed"], stdout=subprocess.PIPE, text=True) for _ in range(2)
        ]
        for proc in procs:
            assert proc.leash_tree is None
            with pytest.raises(leash.Unleashed, match=f"process {proc.pid} runs unleashed"):
                _ = proc.tree
            assert proc.communicate(timeout=60)[0] == "unleashed\n"
    # Once for the lease, at the caller's line (here), however many commands run unleashed.
    warned = [w for w in recwarn if issubclass(w.category, leash.UnleashedWarning)]
    assert len(warned) == 1, [str(w.message) for w in warned]
    assert warned[0].filename == __file__
    message = str(warned[0].message)
    assert "UNLEASHED" in message and "sudo systemctl start leash" in message
    # Each command, in the log, below the default level; nothing logged as a warning.
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "leash"]
    assert [m for level, m in logged if level >= logging.WARNING] == []
    assert len([m for _, m in logged if "'echo unleashed'" in m]) == 2, logged


def test_optional_leashes_when_it_can() -> None:
    with leash.Lease(optional=True) as lease:
        assert lease.leashed
        proc = lease.popen(["true"])
        assert isinstance(proc.leash_tree, int)
        proc.wait()


HOST_AT_THE_LIMIT = """
import json, sys, leash
lease = leash.Lease()
procs = []
try:
    while len(procs) <= 100:
        procs.append(lease.popen(["sleep", "600"]))
    print(json.dumps({"error": "no limit"}), flush=True)
except leash.LimitReached as e:
    started = [p.pid for p in procs]
    print(json.dumps({"started": started, "code": e.code, "message": e.message}), flush=True)
try:
    lease.adopt(int(sys.argv[1]))  # a root process: not this user's to register
except leash.PermissionDenied as e:
    print(json.dumps({"adopt_code": e.code, "adopt_message": e.message}), flush=True)
sys.stdin.readline()
lease.close()
print(json.dumps({"closed": [p.wait() for p in procs]}), flush=True)
"""


def test_at_the_tree_limit_popen_raises_limit_reached_and_nothing_runs(
    cgroups: Callable[[str], Cgroup], for_anyone: Path, user_dir: Path, test_user: int
) -> None:
    limit = int(required_env("LEASH_TEST_MAX_TREES"))
    cgroup = cgroups("limit")
    with subprocess.Popen(
        cgroup.wrap(
            [SYSTEM_PYTHON, "-s", "-c", HOST_AT_THE_LIMIT, str(os.getpid())], uid=test_user
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=user_env(for_anyone, user_dir),
        cwd=user_dir,
    ) as host:
        try:
            assert host.stdin is not None and host.stdout is not None
            lines = Lines(host.stdout)
            report = json.loads(lines.until(lambda line: line.startswith("{")))
            assert report.get("code") == "limit_reached", report
            assert "trees" in report["message"], report
            assert len(report["started"]) == limit
            # The refused shim is gone: the host and the trees it was allowed, nothing else.
            assert cgroup.procs() == {host.pid, *report["started"]}
            permission = json.loads(lines.until(lambda line: "adopt_code" in line))
            assert permission["adopt_code"] == "permission_denied", permission
            host.stdin.write(b"\n")
            host.stdin.flush()
            closed = json.loads(lines.until(lambda line: "closed" in line))
            assert closed["closed"] == [-15] * limit
            assert host.wait(timeout=60) == 0
            assert cgroup.wait_empty()
        finally:
            host.kill()
            host.wait()
