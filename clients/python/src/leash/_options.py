"""The keyword arguments of subprocess.Popen and asyncio's create_subprocess_*, as typed dicts
(after typeshed, the standard library's stubs), so that `lease.popen(..., stdot=PIPE)` is a
type error as `subprocess.Popen(..., stdot=PIPE)` is. What decides text or bytes (`text`,
`encoding`, `errors`, `universal_newlines`) is left to the overloads of `Lease.popen`."""

from __future__ import annotations

import sys
from typing import (
    IO,
    Any,
    Callable,
    Collection,
    Iterable,
    Literal,
    Mapping,
    Optional,
    TypedDict,
    Union,
)

from ._shim import StrOrBytesPath

File = Union[None, int, IO[Any]]
Env = Union[Mapping[bytes, StrOrBytesPath], Mapping[str, StrOrBytesPath]]


class _ChildOptions(TypedDict, total=False):
    """What subprocess.Popen and asyncio's create_subprocess_* both take, typed alike."""

    stdin: File
    stdout: File
    stderr: File
    executable: Optional[StrOrBytesPath]
    preexec_fn: Optional[Callable[[], object]]
    close_fds: bool
    cwd: Optional[StrOrBytesPath]
    env: Optional[Env]
    startupinfo: Any
    creationflags: int
    restore_signals: bool
    start_new_session: bool
    pass_fds: Collection[int]
    user: Union[str, int, None]
    group: Union[str, int, None]
    umask: int


class _PopenOptions39(_ChildOptions, total=False):
    bufsize: int
    shell: bool
    extra_groups: Optional[Iterable[Union[str, int]]]


class _ProcessOptions39(_ChildOptions, total=False):
    limit: int
    bufsize: Literal[0]
    encoding: None
    errors: None
    text: Optional[Literal[False]]
    universal_newlines: Literal[False]
    extra_groups: Optional[Collection[Union[str, int]]]


if sys.version_info >= (3, 11):

    class PopenOptions(_PopenOptions39, total=False):
        """subprocess.Popen's keyword arguments, less those that choose text or bytes."""

        pipesize: int
        process_group: Optional[int]

    class ProcessOptions(_ProcessOptions39, total=False):
        """asyncio.create_subprocess_exec's keyword arguments."""

        pipesize: int
        process_group: Optional[int]

elif sys.version_info >= (3, 10):

    class PopenOptions(_PopenOptions39, total=False):
        pipesize: int

    class ProcessOptions(_ProcessOptions39, total=False):
        pipesize: int

else:
    PopenOptions = _PopenOptions39
    ProcessOptions = _ProcessOptions39
