"""What crosses between Python and libshardload, checked at the crossing: a relative
SHARDLOAD_LIBRARY is resolved once, so a chdir cannot make the library load a module planted
in the new directory.

    python python/tests/test_boundary.py --tmp DIR       (SHARDLOAD_LIBRARY / PYTHONPATH as ctest sets)
Exit 77 where torch or safetensors is missing, unless SHARDLOAD_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import save_file
except Exception as e:  # pragma: no cover
    print(f"skipped: torch/safetensors not importable ({e})")
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)

import shardload

CHECKS = 0


def check(cond, what):
    global CHECKS
    CHECKS += 1
    if not cond:
        raise AssertionError(what)


def relative_library(tmp):
    """SHARDLOAD_LIBRARY relative to the directory python starts in, then a chdir to a
    directory where the same relative path holds a working module (tests/modules/hostmem.c,
    which the library's own directory lacks): it must not be loaded."""
    lib = os.path.realpath(os.environ["SHARDLOAD_LIBRARY"])
    libdir = os.path.dirname(lib)
    rel = os.path.join(os.path.basename(libdir), os.path.basename(lib))
    module = os.path.join(os.environ.get("SHARDLOAD_TEST_MODULES", ""), "libshardload-hostmem.so")
    check(os.path.isfile(module), f"{module}: the test module is not built (SHARDLOAD_TEST_MODULES)")
    check(not os.path.exists(os.path.join(libdir, "libshardload-hostmem.so")), "hostmem beside the library")
    elsewhere = tempfile.mkdtemp(dir=tmp, prefix="chdir-")
    os.makedirs(os.path.join(elsewhere, os.path.basename(libdir)))
    shutil.copy(module, os.path.join(elsewhere, os.path.basename(libdir)))
    code = f"""
import os, shardload
print(shardload.library_path())
os.chdir({elsewhere!r})
try:
    print("loaded the planted module:", shardload.Context(backend="hostmem").backend)
except shardload.ShardloadError as e:
    print(e)
"""
    env = dict(os.environ, SHARDLOAD_LIBRARY=rel)
    env.pop("SHARDLOAD_MODULE_PATH", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(libdir), env=env, capture_output=True,
                       text=True, timeout=120)
    check(r.returncode == 0, f"relative SHARDLOAD_LIBRARY: rc {r.returncode} {r.stderr[-600:]}")
    where, message = (r.stdout.splitlines() + ["", ""])[:2]
    check(where == lib, f"library_path() is {where!r}, want the absolute real {lib!r}")
    check(not message.startswith("loaded the planted module") and "hostmem" in message,
          f"backend 'hostmem' after a chdir: {message}")
    print(f"relative SHARDLOAD_LIBRARY {rel}: loaded as {where}; after a chdir: {message[:100]}", flush=True)


PATH = ""


def main():
    global PATH
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=a.tmp)
    PATH = os.path.join(tmp, "m.safetensors")
    save_file({"w": torch.arange(35, dtype=torch.float32).reshape(7, 5)}, PATH)
    print(f"libshardload {shardload.version()} from {shardload.library_path()}", flush=True)
    relative_library(tmp)
    print(f"test_boundary: {CHECKS} checks passed", flush=True)


if __name__ == "__main__":
    main()
