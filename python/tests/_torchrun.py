"""The CTest entry of the multi-rank Python tests: the test file under torchrun, once per world,
or exit 77 (skipped) where a module it needs is not importable -- a failure (1) under
SHARDLOAD_REQUIRE_TORCH=1, as CI runs it. Imports nothing heavy itself, so that it can say what
is missing."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from typing import Callable, Sequence


def run(script: str, worlds: Sequence[str], rest: Sequence[str], needs: Sequence[str],
        extra: Callable[[str], list] = lambda world: []) -> int:
    """SCRIPT under `torch.distributed.run --standalone` with each world of WORLDS in turn (REST
    and EXTRA(world) as its arguments); the first failing world's status, else 0."""
    try:
        for mod in needs:
            importlib.import_module(mod)
    except Exception as e:
        print(f"skipped: {'/'.join(needs)} not importable ({e})")
        return 1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77
    for w in worlds:
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", w,
                              os.path.abspath(script)] + list(rest) + extra(w), timeout=540)
        if len(worlds) > 1:
            print(f"world {w}: {time.monotonic() - t0:.1f} s wall", flush=True)
        if rc:
            return rc
    return 0
