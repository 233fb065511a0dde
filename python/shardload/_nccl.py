"""Where the NCCL module finds NCCL when it is not on the loader's path.

Inside a torch job on CUDA, torch has loaded its NCCL already and the module's
dlopen("libnccl.so.2") returns that very copy (the loader matches the soname of what is loaded).
Without it (the command, or a process that did not import torch's CUDA part yet), the copy a
pip-installed torch uses lives in the nvidia-nccl wheel (nvidia/nccl/lib/libnccl.so.2), which
is on no loader path: the module tries $SHARDLOAD_NCCL_LIBRARY after its own dlopen fails, and
this names the wheel's file there, unless the variable is set already.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import MutableMapping

ENV = "SHARDLOAD_NCCL_LIBRARY"


def wheel_nccl() -> str | None:
    """The nvidia-nccl wheel's libnccl.so.2 (nvidia-nccl-cu12 or -cu13), or None. Finds the
    `nvidia` namespace package's folders without importing anything."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        p = Path(folder) / "nccl" / "lib" / "libnccl.so.2"
        if p.is_file():
            return str(p)
    return None


def export_wheel_nccl(env: MutableMapping[str, str]) -> None:
    """Set ENV in ENV-mapping `env` to the wheel's NCCL when there is one and it is unset."""
    if not env.get(ENV):
        found = wheel_nccl()
        if found:
            env[ENV] = found
