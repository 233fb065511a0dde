"""`python -m shardload ARGS...`: the `shardload` command this package carries.

A package installed from the repository root (`pip install .`) or from a wheel
(scripts/wheel.sh) holds the command in shardload/_lib/ beside libshardload; this replaces the
Python process with it (exec), so its output, signals and exit status are the command's own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import _nccl


def command_path() -> Path:
    """Where the packaged command is (it may be absent: see main)."""
    return Path(__file__).resolve().parent / "_lib" / "shardload"


def main(argv: list[str]) -> int:
    exe = command_path()
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        print(f"python -m shardload: this package carries no command ({exe} is missing): it was installed "
              "as Python only (pip install ./python). Install it with the native library and the command "
              "(pip install . from the repository root, or a wheel from scripts/wheel.sh), or run a source "
              "build's build/cpu/shardload", file=sys.stderr)
        return 2
    env = dict(os.environ)
    _nccl.export_wheel_nccl(env)  # the NCCL module finds the nvidia-nccl wheel's library too
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(str(exe), ["shardload", *argv], env)
    return 127  # not reached: execve replaces the process or raises OSError


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
