"""What crosses between Python and libshardload, checked at the crossing: strings with an
embedded NUL and integers C cannot hold are refused (ctypes would truncate and wrap them); a
relative SHARDLOAD_LIBRARY is resolved once, so a chdir cannot make the library load a module
planted in the new directory.

    python python/tests/test_boundary.py --tmp DIR       (SHARDLOAD_LIBRARY / PYTHONPATH as ctest sets)
Exit 77 where torch or safetensors is missing, unless SHARDLOAD_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import argparse
import math
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


def expect(exc_type, fn, *needles):
    try:
        fn()
    except exc_type as e:
        for n in needles:
            check(n in str(e), f"error should contain {n!r}: {e!r}")
        return e
    raise AssertionError(f"expected {exc_type.__name__} containing {needles}")


def nuls(tmp, path):
    """Every str and path that reaches C: a NUL is refused, naming the argument."""
    ctx = shardload.Context(backend="cpu")
    src = ctx.open(path)
    e = expect(shardload.ShardloadError, lambda: ctx.open_state_dict({"w\0tail": torch.ones(3)}),
               "state dict key", "null character")
    check(e.status_name == "SL_ERR_INVALID", e.status_name)
    cases = [
        (lambda: ctx.open(path + "\0.ignored"), "path"),
        (lambda: ctx.open(os.fsencode(path) + b"\0"), "path"),
        (lambda: ctx.plan(json=path + "\0x"), "plan json"),
        (lambda: ctx.plan().add_entry("w\0tail"), "plan entry"),
        (lambda: ctx.plan().add_rule("w\0*", "replicate"), "rule pattern"),
        (lambda: ctx.plan().add_rule("w", "shard(0)\0garbage"), "placement"),
        (lambda: ctx.plan(default_placement="replicate\0x"), "default_placement"),
        (lambda: ctx.plan(param_dtype="F32\0x"), "dtype"),
        (lambda: src["w\0tail"], "tensor name"),
        (lambda: "w\0tail" in src, "tensor name"),
        (lambda: ctx.plan().describe(src, "w\0tail"), "tensor name"),
        (lambda: ctx.open_state_dict({"a": torch.ones(2)}, label="state\0dict"), "label"),
        (lambda: shardload.Context(backend="cpu\0ignored"), "backend"),
        (lambda: shardload.Context(backend="cpu", collective="local\0x"), "collective"),
        (lambda: shardload.Context(backend="cpu", job_key="job\0x"), "job_key"),
        (lambda: shardload.Context(backend="cpu", world_size=1, rank=0, rendezvous="file:///tmp\0x"), "rendezvous"),
    ]
    for fn, what in cases:
        expect(ValueError, fn, what, "null")
    # a failure message may carry a NUL: shown, not cut short
    e = expect(shardload.ShardloadError, lambda: ctx.agree(False, "before\0after"), "before\\0after")
    ctx.close()
    print(f"embedded NULs: {len(cases) + 2} refused or shown", flush=True)


def integers(tmp, path):
    """Every int that reaches a C field or argument: out of range or of the wrong kind is
    refused, naming the argument, where C would have wrapped or misread it."""
    ctx = shardload.Context(backend="cpu")
    src = ctx.open(path)
    plan = ctx.plan()
    big = 2**32 + 1  # wraps to 1 in a C int
    cases = [
        (ValueError, lambda: ctx.plan(mesh=[big]), "mesh[0]"),
        (ValueError, lambda: ctx.plan(mesh=[1, 0]), "mesh[1]"),
        (TypeError, lambda: ctx.plan(mesh=[True]), "mesh[0]"),
        (TypeError, lambda: ctx.plan(mesh=[1.0]), "mesh[0]"),
        (ValueError, lambda: shardload.Context(backend="cpu", device=2**32), "device"),
        (ValueError, lambda: shardload.Context(backend="cpu", device=-1), "device"),
        (TypeError, lambda: shardload.Context(backend="cpu", device=True), "device"),
        (ValueError, lambda: shardload.Context(backend="cpu", timeout=4294967.3), "timeout"),
        (ValueError, lambda: shardload.Context(backend="cpu", timeout=0), "timeout"),
        (ValueError, lambda: shardload.Context(backend="cpu", timeout=math.nan), "timeout"),
        (ValueError, lambda: shardload.Context(backend="cpu", timeout=math.inf), "timeout"),
        (ValueError, lambda: shardload.Context(backend="cpu", world_size=big, rank=0), "world_size"),
        (ValueError, lambda: shardload.Context(backend="cpu", world_size=0, rank=0), "world_size"),
        (ValueError, lambda: shardload.Context(backend="cpu", world_size=1, rank=big), "rank"),
        (ValueError, lambda: shardload.Context(backend="cpu", world_size=1, rank=0, local_rank=big), "local_rank"),
        (ValueError, lambda: shardload.Context(backend="cpu", world_size=1, rank=0, local_rank=-1), "local_rank"),
        (ValueError, lambda: ctx.load(plan, src, staging_bytes=-1), "staging_bytes"),
        (ValueError, lambda: ctx.load(plan, src, staging_bytes=2**64), "staging_bytes"),
        (ValueError, lambda: ctx.load(plan, src, pipeline_slots=2**32 + 2), "pipeline_slots"),
        (ValueError, lambda: plan.geometry(src, "w", rank=0, world=2**32 + 4), "world"),
        (ValueError, lambda: plan.geometry(src, "w", rank=2**32 + 3, world=4), "rank"),
        (ValueError, lambda: plan.mesh(2**32 + 4), "world"),
        (ValueError, lambda: plan.check(src, 2**32 + 4), "world_size"),
    ]
    for exc, fn, what in cases:
        e = expect(exc, fn, what)
        check(exc is TypeError or "out of range" in str(e), f"{what}: {e}")
    # the bounds themselves cross intact
    check(ctx.plan(mesh=[1]).mesh() == [1], "mesh [1]")
    st = ctx.load(plan, src, staging_bytes=2**20, pipeline_slots=1)
    check(torch.equal(st["w"].to_torch(), torch.arange(35, dtype=torch.float32).reshape(7, 5)), "a load with bounds")
    ctx.close()
    with shardload.Context(backend="cpu", timeout=2147483.0) as c2:
        check(c2.world_size == 1, "the largest timeout a C int of ms holds")
    print(f"integers: {len(cases)} out of range or of the wrong kind refused", flush=True)


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
    nuls(tmp, PATH)
    integers(tmp, PATH)
    relative_library(tmp)
    print(f"test_boundary: {CHECKS} checks passed", flush=True)


if __name__ == "__main__":
    main()
