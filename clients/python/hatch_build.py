"""The platform wheels: the pure wheel plus the `leash` binary, at leash/_bin/leash.

Without the two variables below the build is the pure wheel (`py3-none-any`), which finds
`leash` on PATH or through LEASH_BIN. With them, the wheel carries the binary and is tagged for
the platform it runs on; `cargo xtask packages` sets them for each binary `cargo xtask dist`
staged:

    LEASH_WHEEL_BINARY=/path/to/leash LEASH_WHEEL_PLATFORM=manylinux_2_31_x86_64

Why a hook and not maturin's `bin` bindings, which build a Rust binary into a wheel: the binary
is built once, by `cargo xtask dist` (zig linking against glibc 2.31, embedding eBPF programs
built with nightly and bpf-linker), and checked there; maturin would build it again its own
way, without that toolchain and those checks. The wheel takes the file as it is.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BINARY_ENV = "LEASH_WHEEL_BINARY"
PLATFORM_ENV = "LEASH_WHEEL_PLATFORM"
# Where the library looks for it (src/leash/_shim.py, PACKAGED_BINARY).
PACKAGED_PATH = "leash/_bin/leash"
# The platforms the binary is built for: glibc Linux on x86_64 and arm64.
PLATFORM = re.compile(r"manylinux_\d+_\d+_(x86_64|aarch64)")


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: Dict[str, Any]) -> None:
        binary = os.environ.get(BINARY_ENV)
        platform = os.environ.get(PLATFORM_ENV)
        if self.target_name != "wheel" or version == "editable":
            return
        if not binary and not platform:
            return  # the pure wheel
        if not binary or not platform:
            raise ValueError(f"{BINARY_ENV} and {PLATFORM_ENV} go together: set both or neither")
        if not PLATFORM.fullmatch(platform):
            raise ValueError(
                f"{PLATFORM_ENV}={platform!r} is not a platform tag the binary is built for "
                "(manylinux_X_Y_x86_64 or manylinux_X_Y_aarch64)"
            )
        mode = os.stat(binary).st_mode
        if not stat.S_ISREG(mode) or not mode & stat.S_IXUSR:
            raise ValueError(f"{BINARY_ENV}={binary!r} is not an executable file")
        # The wheel keeps the executable bit (hatchling writes 0755 for an executable file).
        build_data["force_include"][binary] = PACKAGED_PATH
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform}"
