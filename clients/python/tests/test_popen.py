"""`Lease.popen` behaves as subprocess.Popen does, and its command is on the leash: its pid is
the command's own, and the daemon lists it as the root of `proc.leash_tree`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Cgroup, alive, wait_until

import leash


def tree_of(lease: leash.Lease, tree: int) -> leash.Tree:
    listed = [t for t in lease.trees() if t.tree == tree]
    assert len(listed) == 1, f"tree {tree} is not among the lease's: {lease.trees()}"
    return listed[0]


def test_the_pid_is_the_commands_own_and_its_tree_is_listed(lease: leash.Lease) -> None:
    proc = lease.popen(["sleep", "600"])
    try:
        assert isinstance(proc, subprocess.Popen)
        assert proc.args == ["sleep", "600"]
        assert isinstance(proc.leash_tree, int)
        assert wait_until(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n")
        tree = tree_of(lease, proc.leash_tree)
        assert tree.root == proc.pid
        assert tree.lease == lease.lease_id
        assert tree.host_pid == os.getpid()
        assert tree.on_root_exit == "kill"
    finally:
        proc.kill()
        proc.wait()


def test_pipes_text_and_returncode(lease: leash.Lease) -> None:
    proc = lease.popen(
        ["sh", "-c", 'read line; echo "out:$line"; echo "err:$line" >&2; exit 7'],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate("hello\n", timeout=60)
    assert (out, err, proc.returncode) == ("out:hello\n", "err:hello\n", 7)


def test_bytes_pipes_and_check_output_style(lease: leash.Lease) -> None:
    proc = lease.popen(["printf", "a\\0b"], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=60)
    assert out == b"a\0b" and proc.returncode == 0


def test_cwd(lease: leash.Lease, tmp_path: Path) -> None:
    proc = lease.popen(["pwd"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert proc.communicate(timeout=60)[0].strip() == str(tmp_path)


def test_a_missing_cwd_raises_as_popen_does(lease: leash.Lease, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(FileNotFoundError) as raised:
        lease.popen(["true"], cwd=missing)
    assert os.fspath(raised.value.filename) == str(missing)


def test_env_and_the_token_stays_out_of_it(
    lease: leash.Lease, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host that itself was given a token in LEASH_LEASE must not hand it on.
    monkeypatch.setenv("LEASH_LEASE", "0123456789abcdef")
    proc = lease.popen(
        ["sh", "-c", 'echo "$GREETING"; env | grep -c LEASH_LEASE; ls /proc/self/fd | wc -l'],
        env={"GREETING": "hi", "PATH": os.environ["PATH"], "LEASH_LEASE": "x"},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=60)
    greeting, token_vars, fds = out.split()
    assert greeting == "hi"
    assert token_vars == "0", "LEASH_LEASE reached the command"
    # stdin, stdout, stderr and ls's own directory: the token and status pipes are closed.
    assert int(fds) == 4, f"the command holds {fds} descriptors"

    inherited = lease.popen(
        ["sh", "-c", 'echo "${LEASH_LEASE-unset}"'], stdout=subprocess.PIPE, text=True
    )
    assert inherited.communicate(timeout=60)[0].strip() == "unset"


def test_start_new_session(lease: leash.Lease) -> None:
    proc = lease.popen(["sleep", "600"], start_new_session=True)
    try:
        assert wait_until(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n")
        assert os.getsid(proc.pid) == proc.pid
        assert os.getpgid(proc.pid) == proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Popen(process_group=) is Python 3.11+")
def test_process_group(lease: leash.Lease) -> None:
    proc = lease.popen(["sleep", "600"], process_group=0)
    try:
        assert wait_until(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n")
        assert os.getpgid(proc.pid) == proc.pid
        assert os.getsid(proc.pid) == os.getsid(0)
    finally:
        proc.kill()
        proc.wait()


def test_shell(lease: leash.Lease) -> None:
    proc = lease.popen("echo $((6 * 7)) $0", shell=True, stdout=subprocess.PIPE, text=True)
    assert proc.communicate(timeout=60)[0].split() == ["42", "/bin/sh"]
    assert isinstance(proc.leash_tree, int)


def test_executable_sets_the_program_and_args_0_stays_argv0(lease: leash.Lease) -> None:
    proc = lease.popen(
        ["my-agent", "-c", 'echo "$0"'], executable="sh", stdout=subprocess.PIPE, text=True
    )
    assert proc.communicate(timeout=60)[0].strip() == "my-agent"


def test_a_string_command(lease: leash.Lease) -> None:
    proc = lease.popen("true")
    assert proc.wait(timeout=60) == 0


def test_a_missing_program_raises_file_not_found_and_leaves_nothing(lease: leash.Lease) -> None:
    with pytest.raises(FileNotFoundError) as raised:
        lease.popen(["no-such-program-leash-test", "arg"])
    assert raised.value.errno == 2
    assert raised.value.filename == "no-such-program-leash-test"
    assert wait_until(lambda: not lease.trees()), f"a tree is left: {lease.trees()}"


def test_a_file_that_is_not_executable_raises_permission_error(
    lease: leash.Lease, tmp_path: Path
) -> None:
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with pytest.raises(PermissionError):
        lease.popen([str(script)])


def test_pass_fds_and_close_fds(lease: leash.Lease) -> None:
    read, write = os.pipe()
    try:
        os.write(write, b"through fd\n")
        os.close(write)
        proc = lease.popen(
            ["cat", f"/dev/fd/{read}"], pass_fds=[read], stdout=subprocess.PIPE, text=True
        )
        assert proc.communicate(timeout=60)[0] == "through fd\n"
    finally:
        os.close(read)

    # close_fds=False: what is inheritable is inherited, as with Popen.
    read, write = os.pipe()
    try:
        os.set_inheritable(read, True)
        os.write(write, b"inherited\n")
        os.close(write)
        proc = lease.popen(
            ["cat", f"/dev/fd/{read}"], close_fds=False, stdout=subprocess.PIPE, text=True
        )
        assert proc.communicate(timeout=60)[0] == "inherited\n"
    finally:
        os.close(read)


def test_grace_and_keep_on_root_exit_reach_the_daemon(lease: leash.Lease) -> None:
    proc = lease.popen(["sleep", "600"], grace=0.25, keep_on_root_exit=True)
    try:
        tree = tree_of(lease, proc.leash_tree)
        assert (tree.grace_ms, tree.on_root_exit) == (250, "keep")
    finally:
        proc.kill()
        proc.wait()
    with leash.Lease(grace=1.5) as other:
        proc = other.popen(["sleep", "600"])
        assert tree_of(other, proc.leash_tree).grace_ms == 1500
    assert proc.wait(timeout=60) < 0


def test_closing_the_lease_kills_every_tree(cgroups) -> None:  # type: ignore[no-untyped-def]
    cgroup: Cgroup = cgroups("close")
    with leash.Lease(grace=0.2) as lease:
        agent = lease.popen(
            cgroup.wrap(["sh", "-c", 'trap "" TERM; setsid sleep 600 & sleep 600']),
            start_new_session=True,
        )
        tool = lease.popen(cgroup.wrap(["sleep", "600"]))
        assert wait_until(lambda: len(cgroup.procs()) == 4)
        members = cgroup.procs()
    # close() returned: both trees are empty.
    assert cgroup.procs() == set(), f"left of {members}: {cgroup.procs()}"
    # It ignores SIGTERM: SIGKILL after the grace, for it (-9) or first for the sleep it waits
    # for, which it may report before its own SIGKILL comes (exit status 128 + 9).
    assert agent.wait(timeout=60) in (-9, 128 + 9)
    assert tool.wait(timeout=60) == -15
    assert not alive(agent.pid)


def test_the_command_holds_no_token_descriptor_and_no_token_variable(lease: leash.Lease) -> None:
    """The shim's token and status descriptors are closed before the command runs, and a
    LEASH_LEASE the host has is not passed on: the command holds what a plain Popen's does."""
    script = 'ls /proc/$$/fd; echo "token:${LEASH_LEASE-none}"'
    env = dict(os.environ, LEASH_LEASE="0123456789abcdef0123456789abcdef")
    leashed = lease.popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    leashed_out = leashed.communicate(timeout=60)[0].split()
    plain_out = plain.communicate(timeout=60)[0].split()
    assert leashed_out[-1] == "token:none", leashed_out
    assert sorted(leashed_out[:-1]) == sorted(plain_out[:-1]), (leashed_out, plain_out)
