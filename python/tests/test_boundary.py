"""What crosses between Python and libshardload, checked at the crossing: strings with an
embedded NUL and integers C cannot hold are refused (ctypes would truncate and wrap them);
an exception in a callback (read, bind, progress), KeyboardInterrupt and SystemExit
included, fails the load on every rank and is raised once the load returns; a signal during
a load ends it on every rank at once and raises KeyboardInterrupt (real processes, real Gloo
over a file:// rendezvous); a relative SHARDLOAD_LIBRARY is resolved once, so a chdir cannot
make the library load a module planted in the new directory.

    python python/tests/test_boundary.py --tmp DIR [--all]   (SHARDLOAD_LIBRARY / PYTHONPATH as ctest sets)
The single-process parts (SINGLE_PROCESS) run under pytest (python/tests/unit/test_scripts.py,
CTest python_pytest); this script runs the ones with real ranks, signals and a planted module
(and with --all, those too).
Exit 77 where torch or safetensors is missing, unless SHARDLOAD_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:
    import torch
    from safetensors.torch import save_file
except Exception as e:  # pragma: no cover
    print(f"skipped: torch/safetensors not importable ({e})")
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)

import shardload

CHECKS = 0
TIMEOUT_S = 60.0  # the contexts' timeout in the signal cases; an interrupted load ends far sooner


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


class Raising(torch.Tensor):
    """A tensor subclass whose contiguous() raises EXC: the state-dict source's read callback
    makes a strided entry contiguous, so the exception is raised inside that callback."""
    exc: BaseException = KeyboardInterrupt("raised by a tensor subclass")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.contiguous:
            raise cls.exc
        return super().__torch_function__(func, types, args, kwargs or {})


def raising(exc: BaseException, rows=4, cols=6):
    cls = type("Raising" + type(exc).__name__, (Raising,), {"exc": exc})
    return torch.arange(rows * cols, dtype=torch.float32).reshape(cols, rows).t().as_subclass(cls)


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


def callbacks(tmp=None, path=None):
    """An exception in a callback never unwinds into C: the load fails, the original is raised."""
    sd = {"a": torch.arange(24, dtype=torch.float32).reshape(6, 4).t(), "b": torch.ones(5)}
    ctx = shardload.Context(backend="cpu")
    plan = ctx.plan()
    src = ctx.open_state_dict(sd)
    for exc in (KeyboardInterrupt("in read"), SystemExit(3)):
        bad = ctx.open_state_dict({"a": sd["a"], "boom": raising(exc)})
        e = expect(type(exc), lambda: ctx.load(plan, bad))
        check(e is exc, f"read: the callback's own {exc!r} is raised, got {e!r}")
        # a read failure is an ordinary failure: the context goes on
        check(torch.equal(ctx.load(plan, src)["a"].to_torch(), sd["a"].contiguous()), f"after read {exc!r}")
    e = expect(shardload.ShardloadError, lambda: ctx.load(plan, ctx.open_state_dict({"boom": raising(ValueError("bad"))})),
               "boom", "ValueError: bad")
    check(isinstance(e.__cause__, ValueError), f"read: cause {e.__cause__!r}")
    for exc in (KeyboardInterrupt("in bind"), SystemExit(4)):
        def bind(t, exc=exc):
            raise exc
        e = expect(type(exc), lambda: ctx.load(plan, src, bind=bind))
        check(e is exc, f"bind: the callback's own {exc!r} is raised, got {e!r}")
        check(torch.equal(ctx.load(plan, src)["b"].to_torch(), sd["b"]), f"after bind {exc!r}")
    ctx.close()
    # progress fails the load through its status (sl_load_options.progress_status), as a
    # failure of rank 0's: the context goes on
    for exc in (KeyboardInterrupt("in progress"), SystemExit(5), ValueError("in progress")):
        calls = []

        def progress(done, total, exc=exc):
            calls.append(done)
            raise exc
        with shardload.Context(backend="cpu") as c:
            want = shardload.ShardloadError if isinstance(exc, Exception) else type(exc)
            e = expect(want, lambda: c.load(c.plan(), c.open_state_dict(sd), progress=progress))
            if want is shardload.ShardloadError:
                check("progress callback failed" in str(e) and "ValueError: in progress" in str(e)
                      and e.__cause__ is exc, f"{e!r}")
            else:
                check(e is exc, f"progress: the callback's own {exc!r} is raised, got {e!r}")
            check(len(calls) == 1, f"progress called again after it raised: {calls}")
            check(torch.equal(c.load(c.plan(), c.open_state_dict(sd))["b"].to_torch(), sd["b"]),
                  f"the context loads again after progress raised {exc!r}")
    print("callbacks: BaseException in read, bind and progress fails the load and is raised", flush=True)


# ---- two real ranks, a signal or a callback's exception mid-load --------------------------

def rank_main(rank, rdzv, tmp, case, out):
    res = {"rank": rank, "outcome": "?", "message": ""}
    try:
        ctx = shardload.Context(backend="cpu", world_size=2, rank=rank, rendezvous=rdzv, timeout=TIMEOUT_S)
        g = torch.Generator().manual_seed(3)
        sd = None
        if rank == 0:
            sd = {f"t{i:02d}": torch.randn(64, 64, generator=g) for i in range(40)}
            if case == "read-systemexit":
                sd["t20"] = raising(SystemExit(7), 64, 64)
        src = ctx.open_state_dict(sd)
        marker = os.path.join(tmp, "mid-load")

        def slowly():  # rank 0: 40 tensors, 0.5 s each: the load takes 20 s
            if not os.path.exists(marker):
                open(marker, "w").close()
            time.sleep(0.5)
        kw = {}
        if rank == 0 and case == "sigint":
            kw["progress"] = lambda done, total: slowly()
        if rank == 0 and case == "sigint-bind":
            kw["bind"] = lambda t: slowly()  # None: the state owns the buffer
        ctx.load(ctx.plan(), src, staging_bytes=64 << 10, **kw)
        res["outcome"] = "loaded"
    except KeyboardInterrupt:
        res["outcome"] = "KeyboardInterrupt"
    except SystemExit as e:
        res["outcome"] = f"SystemExit({e.code})"
    except shardload.ShardloadError as e:
        res["outcome"], res["message"] = "ShardloadError", str(e)
    except BaseException as e:
        res["outcome"] = f"{type(e).__name__}: {e}"
    res["end"] = time.time()
    out.put(res)


def two_ranks(tmp, case, target=None):
    """Ranks 0 and 1 load one state dict; TARGET gets SIGINT once the load is under way."""
    d = tempfile.mkdtemp(dir=tmp, prefix=case + "-")
    rdzv = f"file://{os.path.join(d, 'rdzv')}"
    os.makedirs(rdzv[len('file://'):])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, rdzv, d, case, q)) for r in range(2)]
    for p in procs:
        p.start()
    sent = None
    if target is not None:
        marker = os.path.join(d, "mid-load")
        deadline = time.time() + 120
        while not os.path.exists(marker):
            if time.time() > deadline or not all(p.is_alive() for p in procs):
                for p in procs:
                    p.kill()
                raise AssertionError(f"{case}: the load never started")
            time.sleep(0.05)
        time.sleep(1.0)  # well inside the 20 s load
        sent = time.time()
        os.kill(procs[target].pid, signal.SIGINT)
    got = {}
    try:
        for _ in procs:
            r = q.get(timeout=3 * TIMEOUT_S)
            got[r["rank"]] = r
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return got, sent


def signals_and_peers(tmp):
    # Ctrl-C on rank 0, inside sl_load with a progress callback running, then with a bind
    # callback running; then on rank 1, which has no callback at all: that rank raises
    # KeyboardInterrupt, the other fails at once
    for case, target in (("sigint", 0), ("sigint-bind", 0), ("sigint", 1)):
        got, sent = two_ranks(tmp, case, target)
        other = 1 - target
        check(got[target]["outcome"] == "KeyboardInterrupt", f"SIGINT to rank {target}: it ended with {got[target]}")
        check(got[other]["outcome"] == "ShardloadError", f"SIGINT to rank {target}: rank {other} ended with {got[other]}")
        for r in (0, 1):
            took = got[r]["end"] - sent
            check(took < TIMEOUT_S / 3, f"SIGINT to rank {target}: rank {r} ended {took:.1f} s after the signal "
                  f"(the timeout is {TIMEOUT_S:.0f} s, the load 20 s)")
        print(f"SIGINT to rank {target} mid-load ({case}): KeyboardInterrupt there after "
              f"{got[target]['end'] - sent:.1f} s, rank {other} failed after {got[other]['end'] - sent:.1f} s: "
              f"{got[other]['message'][:120]}", flush=True)
    # SystemExit from rank 0's read callback: raised there, every other rank fails naming the tensor
    got, _ = two_ranks(tmp, "read-systemexit")
    check(got[0]["outcome"] == "SystemExit(7)", f"read SystemExit: rank 0 ended with {got[0]}")
    check(got[1]["outcome"] == "ShardloadError" and "t20" in got[1]["message"] and "SystemExit" in got[1]["message"],
          f"read SystemExit: rank 1 ended with {got[1]}")
    print("SystemExit in rank 0's read callback: raised there; rank 1: " + got[1]["message"][:160], flush=True)


def interrupted_rendezvous(tmp):
    """Ctrl-C while the context waits for a peer that never comes: KeyboardInterrupt at once
    (not after the timeout) and a clean exit."""
    d = tempfile.mkdtemp(dir=tmp, prefix="rdzv-")
    code = f"""
import sys, time, shardload
print("creating", flush=True)
t0 = time.time()
try:
    shardload.Context(backend="cpu", world_size=2, rank=0, rendezvous="file://{d}", timeout={TIMEOUT_S})
    print("created")
except KeyboardInterrupt:
    print(f"KeyboardInterrupt", flush=True)
    sys.exit(0)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        check(p.stdout.readline().strip() == "creating", "rendezvous child did not start")
        time.sleep(2.0)
        sent = time.time()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=3 * TIMEOUT_S)
    finally:
        if p.poll() is None:
            p.kill()
    took = time.time() - sent
    check(p.returncode == 0 and out.strip() == "KeyboardInterrupt", f"rc {p.returncode} out {out!r} err {err[-600:]!r}")
    check(took < TIMEOUT_S / 3, f"the interrupted rendezvous ended {took:.1f} s after the signal (timeout {TIMEOUT_S:.0f} s)")
    print(f"SIGINT in the rendezvous: KeyboardInterrupt and exit after {took:.1f} s", flush=True)


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
# run by pytest (python/tests/unit/test_scripts.py), each as fn(tmp, path); main runs them with --all
SINGLE_PROCESS = ("nuls", "integers", "callbacks")


def main():
    global PATH
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--all", action="store_true", help="the single-process parts too (python_pytest runs them)")
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=a.tmp)
    PATH = os.path.join(tmp, "m.safetensors")
    save_file({"w": torch.arange(35, dtype=torch.float32).reshape(7, 5)}, PATH)
    print(f"libshardload {shardload.version()} from {shardload.library_path()}", flush=True)
    if a.all:  # the single-process parts, which python_pytest runs (unit/test_scripts.py)
        for name in SINGLE_PROCESS:
            globals()[name](tmp, PATH)
    relative_library(tmp)
    interrupted_rendezvous(tmp)
    signals_and_peers(tmp)
    print(f"test_boundary: {CHECKS} checks passed", flush=True)


if __name__ == "__main__":
    main()
