"""The Python package over libshardload: inspection and planning without torch, loads to torch
tensors through DLPack (zero copy, lifetime), caller buffers through bind, errors as exceptions,
in-memory sources, and reuse of an existing torch.distributed process group's store.

    python python/tests/test_api.py --tmp DIR [--all]   (SHARDLOAD_LIBRARY / PYTHONPATH as ctest sets)
The single-process parts (SINGLE_PROCESS) run under pytest (python/tests/unit/test_scripts.py,
CTest python_pytest); this script runs the ones with real ranks (and with --all, those too).
Exit 77 where torch or safetensors is missing, unless SHARDLOAD_REQUIRE_TORCH=1.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import traceback

try:
    import torch
    from safetensors.torch import save_file
except Exception as e:  # pragma: no cover
    print(f"skipped: torch/safetensors not importable ({e})")
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)

import shardload
from shardload import _dlpack

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
            check(n in str(e), f"error should contain {n!r}: {e}")
        return e
    raise AssertionError(f"expected {exc_type.__name__} containing {needles}")


def checkpoint(tmp):
    g = torch.Generator().manual_seed(5)
    sd = {
        "w": torch.randn(7, 5, generator=g),
        "b16": torch.randn(9, 3, generator=g).to(torch.bfloat16),
        "ids": torch.arange(10, dtype=torch.int64).reshape(5, 2),
        "scalar": torch.tensor(2.5),
        "flags": torch.tensor([True, False, True]),
        "f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "empty": torch.zeros(0, 4),
    }
    path = os.path.join(tmp, "m.safetensors")
    save_file(sd, path, metadata={"format": "pt", "note": "api test"})
    return sd, path


def without_torch(tmp, sd, path):
    """Inspection and planning in a process where importing torch fails."""
    code = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch blocked for this test")
sys.meta_path.insert(0, Block())
import shardload
ctx = shardload.Context()
src = ctx.open({path!r})
names = [t.name for t in src]
plan = ctx.plan(mesh=[4], param_dtype="F32")
g = plan.geometry(src, "w", rank=3, world=4)
assert g["local_shape"] == (1, 5) and g["global_offset"] == (6, 0), g
assert "torch_dtype" not in g and g["dtype"] == "F32", g
assert plan.describe(src, "w") == "[shard(0)]"
plan.check(src, 4)
assert src.metadata["note"] == "api test"
assert "torch" not in sys.modules
print("ok", len(names))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout.startswith("ok 7"), f"without torch: {r.stdout} {r.stderr}")


def world1(tmp, sd, path):
    ctx = shardload.Context(backend="cpu")
    check((ctx.rank, ctx.world_size, ctx.backend) == (0, 1, "cpu"), "world 1 context")
    src = ctx.open(path)
    check(len(src) == 7 and "w" in src and src["w"].shape == (7, 5), "source table")
    plan = ctx.plan(param_dtype=torch.float32)
    g = plan.geometry(src, "b16", rank=0, world=1)
    check(g["dtype"] == "F32" and g["torch_dtype"] is torch.float32, f"geometry names torch's dtype: {g}")
    g = plan.geometry(src, "w", rank=0, world=1)
    check(g["torch_dtype"] is shardload._torch.torch_dtype(g["dtype"]), f"geometry's torch_dtype: {g}")
    st = ctx.load(plan, src)
    tt = st.to_torch()
    for k, v in sd.items():
        want = v.to(torch.float32) if v.dtype in (torch.bfloat16, torch.float32) else v
        check(tt[k].dtype == want.dtype and torch.equal(tt[k], want), f"{k}: loaded {tt[k]} want {want}")
    check(st["b16"].file_dtype == "BF16" and st["b16"].dtype == "F32", "cast recorded")
    check(st["w"].rule == "inferred: no offload policy" and st["w"].device == "device", "placement rule")
    # zero copy: the torch tensor views the state's memory
    check(tt["w"].data_ptr() == st["w"].data_ptr, "DLPack is zero copy")
    # lifetime: the state's memory lives while a tensor views it
    w = tt["w"]
    expected = w.clone()
    del tt, st
    gc.collect()
    junk = [torch.randn(7, 5) for _ in range(64)]  # reuse freed memory if it were freed
    check(torch.equal(w, expected) and _dlpack.live_count() == 1, "a tensor keeps the state alive")
    del w, junk
    gc.collect()
    check(_dlpack.live_count() == 0, "the last tensor releases the state")
    # explicit placement, offload policy
    plan2 = ctx.plan(offload_policy="cpu")
    st2 = ctx.load(plan2, src, cpu_offload=None)
    check(st2["w"].device == "cpu" and st2["w"].rule == "inferred: CPU offload policy", "policy infers CPU")
    st3 = ctx.load(plan2, src, cpu_offload=False)
    check(st3["w"].device == "device" and st3["w"].rule == "cpu_offload=off", "explicit off wins")
    expect(TypeError, lambda: ctx.load(plan2, src, cpu_offload="yes"), "cpu_offload")
    # caller buffers through bind: filled in place, no second copy
    bufs = {}

    def bind(t):
        if t.name in ("w", "ids"):
            bufs[t.name] = torch.full(t.local_shape, -1, dtype=getattr(torch, {"F32": "float32", "I64": "int64"}[t.dtype]))
            return bufs[t.name]
        return None
    st4 = ctx.load(plan, src, bind=bind)
    check(st4["w"].caller_buffer and torch.equal(bufs["w"], sd["w"]), "bind fills the caller's tensor")
    check(st4["w"].to_torch() is bufs["w"], "a caller buffer comes back as the caller's tensor")
    # a bind that fails: one error naming the tensor and the message
    e = expect(shardload.ShardloadError, lambda: ctx.load(plan, src, bind=lambda t: torch.zeros(1)), "needs")
    check(e.status_name == "SL_ERR_BUFFER", f"bind failure status {e.status_name}")
    # C errors as exceptions with the status name and the C message
    e = expect(shardload.ShardloadError, lambda: ctx.open(os.path.join(tmp, "nope.safetensors")), "nope.safetensors")
    check(e.status_name.startswith("SL_ERR_"), "status name")
    bad = os.path.join(tmp, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write(b"\xff" * 16)
    expect(shardload.ShardloadError, lambda: ctx.open(bad), "bad.safetensors")
    expect(shardload.ShardloadError, lambda: ctx.plan().add_rule("w", "shard(x)"), "shard(x)")
    strict = ctx.plan(strict=True).add_entry("absent")
    e = expect(shardload.ShardloadError, lambda: ctx.load(strict, src), "absent")
    check(e.status_name == "SL_ERR_MISSING", e.status_name)
    expect(ValueError, lambda: ctx.load(plan, src, strategy="gather"), "strategy")
    # an in-memory source (a state dict on rank 0): the same bytes as the file
    msrc = ctx.open_state_dict({k: v for k, v in sd.items()})
    st5 = ctx.load(plan, msrc)
    check(all(torch.equal(st5[k].to_torch(), tt_v) for k, tt_v in ((k, ctx.load(plan, src)[k].to_torch()) for k in sd)),
          "memory source = file source")
    expect(shardload.ShardloadError, lambda: ctx.load(plan, msrc, read_mode="every-rank"), "rank0")
    # one distributed reader is rank-0 reads: a state dict loads by it too
    st5r = ctx.load(plan, msrc, read_mode="readers")
    check(all(torch.equal(st5r[k].to_torch(), st5[k].to_torch()) for k in sd), "memory source by one reader")
    # strided and non-contiguous tensors go through the read callback
    nc = {"t": torch.arange(20, dtype=torch.float32).reshape(4, 5).t()}
    st6 = ctx.load(ctx.plan(), ctx.open_state_dict(nc))
    check(torch.equal(st6["t"].to_torch(), nc["t"].contiguous()), "non-contiguous state dict entry")
    # several strided tensors larger than a staging slot, read in pieces between each other
    g = torch.Generator().manual_seed(9)
    many = {f"s{i}": torch.randn(600, 400 + i, generator=g).t() for i in range(3)}
    many["small"] = torch.arange(6, dtype=torch.float32)[::2]
    st8 = ctx.load(ctx.plan(param_dtype="BF16"), ctx.open_state_dict(many), staging_bytes=256 << 10)  # a cast: staged
    check(st8.stats()["transfers"] > 2 * len(many), f"pieces: {st8.stats()}")
    for k, v in many.items():
        check(torch.equal(st8[k].to_torch(), v.contiguous().bfloat16()), f"strided entry {k} read in pieces")
    expect(shardload.ShardloadError, lambda: ctx.open_state_dict({"m": torch.empty(3, device="meta")}), "meta")
    expect(shardload.ShardloadError, lambda: ctx.open_state_dict({"c": torch.zeros(2, dtype=torch.complex64)}), "'c'")
    # the state outlives its context
    st7 = ctx.load(plan, src)
    ctx.close()
    check(torch.equal(st7["w"].to_torch(), sd["w"]), "state outlives its context")
    expect(ValueError, lambda: ctx.open(path), "closed")
    print("world 1: ok", flush=True)


def dlpack_streams(tmp, sd, path):
    """__dlpack__(stream=...) checks the consumer's stream as DLPack defines it and hands it to the
    library (sl_state_export), which refuses a stream for host memory naming the tensor: the
    refusal comes back from C, so the value reached it. Nothing is lent by a refused export."""
    for backend, offload in (("cpu", None), ("sim", True)):  # the cpu backend's memory; a CPU placement on sim
        ctx = shardload.Context(backend=backend)
        st = ctx.load(ctx.plan(param_dtype="F32"), ctx.open(path), cpu_offload=offload)
        t = st["w"]
        check(t.dlpack_device[0] == 1, f"{backend}: host memory is kDLCPU")
        expect(TypeError, lambda: t.__dlpack__(stream="1"), "tensor 'w'", "stream must be an int", "str")
        expect(TypeError, lambda: t.__dlpack__(stream=1.0), "float")
        expect(TypeError, lambda: t.__dlpack__(stream=True), "bool")
        expect(ValueError, lambda: t.__dlpack__(stream=-2), "tensor 'w'", "-2", "not a stream")
        expect(ValueError, lambda: t.__dlpack__(stream=1 << 64), "not a stream")
        e = expect(shardload.ShardloadError, lambda: t.__dlpack__(stream=7), "tensor 'w'", "host memory", "stream=None")
        check(e.status_name == "SL_ERR_INVALID", f"{backend}: refusal status {e.status_name}")
        check(_dlpack.live_count() == 0, f"{backend}: a refused export lends nothing")
        for stream in (None, -1):
            w = torch.utils.dlpack.from_dlpack(t.__dlpack__(stream=stream))
            check(torch.equal(w, sd["w"]) and _dlpack.live_count() == 1, f"{backend}: stream={stream} exports")
            del w
            gc.collect()
            check(_dlpack.live_count() == 0, f"{backend}: stream={stream}: the release reaches the library")
        c = t.__dlpack__()  # never consumed: its destructor releases the export
        check(_dlpack.live_count() == 1, "an unconsumed capsule lends")
        del c
        check(_dlpack.live_count() == 0, "an unconsumed capsule releases")
        # the state outlives its context and owner while a view lives, and goes with the view
        w = st["w"].to_torch()
        ctx.close()
        del st, t
        gc.collect()
        check(torch.equal(w, sd["w"]), f"{backend}: the view outlives its state object and context")
        del w
        gc.collect()
        check(_dlpack.live_count() == 0, f"{backend}: the last view releases")
    print("dlpack streams: ok", flush=True)


def cuda_release_order(tmp):
    """On a GPU: a torch kernel queued on the tensor's stream, still pending when the tensor, its
    state and the context are all gone, reads the loaded bytes (the free waits for it on the
    device). Without the ordering the memory is freed and trimmed under the kernel: an illegal
    address. Skipped without a CUDA device."""
    if not torch.cuda.is_available():
        print("cuda release order: skipped (no CUDA device)", flush=True)
        return
    try:
        ctx = shardload.Context(backend="cuda")
    except shardload.ShardloadError as e:
        print(f"cuda release order: skipped ({e})", flush=True)
        return
    x = torch.arange(1 << 24, dtype=torch.float32)  # 64 MiB
    path = os.path.join(tmp, "cuda_release.safetensors")
    save_file({"x": x}, path)
    st = ctx.load(ctx.plan(), ctx.open(path))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = st["x"].to_torch()  # lent for the side stream
        torch.cuda._sleep(2_000_000_000)  # about a second of spinning ahead of the read
        out = t * 1
    del t
    st.close()
    del st
    ctx.close()
    gc.collect()
    pending = not side.query()
    side.synchronize()
    check(pending, "the side stream's work was still pending at the release (lengthen the sleep)")
    check(torch.equal(out.cpu(), x), "a kernel pending at the release read the loaded bytes")
    print("cuda release order: ok", flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pg_rank(rank, world, init, path, out):
    """A rank of a torch.distributed job that already has its default group: shardload reuses it."""
    try:
        import torch.distributed as dist
        os.environ.pop("LOCAL_RANK", None)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        if rank == 1:  # a context of its own on the side must not shift the job's numbering
            shardload.Context(world_size=1, rank=0).close()
        results = []
        for i in range(2):  # two contexts in a row in one job: distinct keys, same store
            with shardload.Context() as ctx:
                check((ctx.rank, ctx.world_size) == (rank, world), "rank/world from the group")
                src = ctx.open(path)
                # the second one by distributed readers: every rank reads a share and sends it
                how = {"read_mode": "readers", "readers": world} if i else {}
                st = ctx.load(ctx.plan(param_dtype="F32"), src, **how)
                check(not i or st.stats()["bytes_read"] > 0, f"rank {rank} read its share")
                w = st["w"].to_torch()
                results.append((tuple(st["w"].global_offset), w.clone()))
                ctx.agree(True)
        if init.startswith("tcp://"):  # process_group= on subgroups of this job
            results.append(subgroup_loads(rank, world, path))
        dist.barrier()
        dist.destroy_process_group()
        out.put((rank, "ok", [(o, w.tolist()) for o, w in results]))
    except Exception:
        out.put((rank, traceback.format_exc(), None))


def subgroup_loads(rank, world, path):
    """The job of 3 split into groups [0, 1] and [2] that load at the same time over the one
    store (distinct keys per group); the default group named explicitly; a group this rank is
    not in refused. Returns this rank's shard of "w" in its group."""
    import torch.distributed as dist
    groups = [dist.new_group([0, 1]), dist.new_group([2])]  # every rank makes every group
    mine, other = (groups[0], groups[1]) if rank < 2 else (groups[1], groups[0])
    with shardload.Context(process_group=mine) as ctx:
        want = (rank, 2) if rank < 2 else (0, 1)
        check((ctx.rank, ctx.world_size) == want, f"group rank/world: {ctx.rank}/{ctx.world_size}, want {want}")
        st = ctx.load(ctx.plan(param_dtype="F32"), ctx.open(path))
        shard = (tuple(st["w"].global_offset), st["w"].to_torch().clone())
        ctx.agree(True)
    with shardload.Context(process_group=dist.group.WORLD) as ctx:
        check((ctx.rank, ctx.world_size) == (rank, world), "the default group named explicitly")
    try:
        shardload.Context(process_group=other)
        raise AssertionError("a group this rank is not in was accepted")
    except ValueError as e:
        check("not a member" in str(e), f"non-member: {e}")
    return shard


def process_groups(tmp, sd, path):
    """tcp:// (rank 0 serves torch's TCPStore in its own process) and file:// (a FileStore):
    no port of shardload's own, no second server."""
    ctx = mp.get_context("spawn")
    import tempfile
    fresh = tempfile.mkdtemp(dir=tmp)  # torch's FileStore file must not outlive its job
    inits = [f"tcp://127.0.0.1:{free_port()}", f"file://{os.path.join(fresh, 'pg-filestore')}",
             f"file://{os.path.join(fresh, 'pg-filestore2')}"]
    for init in inits:
        q = ctx.Queue()
        procs = [ctx.Process(target=pg_rank, args=(r, 3, init, path, q)) for r in range(3)]
        for p in procs:
            p.start()
        got = {}
        for _ in procs:
            r, status, res = q.get(timeout=120)
            got[r] = (status, res)
        for p in procs:
            p.join(30)
        for r in range(3):
            check(got[r][0] == "ok", f"{init} rank {r}: {got[r][0]}")
            if init.startswith("tcp://"):  # the subgroups' shards: [0, 1] split "w", [2] holds it whole
                off = got[r][1][-1][0]
                check(off[0] == (4 if r == 1 else 0) and len(got[r][1][-1][1]) == (3 if r == 1 else 4 if r == 0 else 7),
                      f"rank {r}: the shard of its group's rank: {off}")
            for off, w in got[r][1]:
                start = off[0]
                check(torch.equal(torch.tensor(w), sd["w"][start:start + len(w)]), f"{init} rank {r}: shard bytes")
        print(f"process group reuse ({init.split(':')[0]}): ok", flush=True)


def exit_with_exports(tmp, sd, path):
    """Tensors exported through DLPack still alive at interpreter exit (module globals, a
    reference cycle): the process exits 0, not in a crash of a freed callback."""
    code = f"""
import gc, shardload
ctx = shardload.Context()
st = ctx.load(ctx.plan(), ctx.open({path!r}))
W = st["w"].to_torch()
class Cycle: pass
c = Cycle(); c.self = c; c.t = st["ids"].to_torch()
del st, c
"""
    for i in range(3):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, f"exit with live exports: rc {r.returncode} {r.stderr[-400:]}")


def resolve(tmp, sd, path):
    check(shardload.resolve_placement(True, None) == ("cpu", "cpu_offload=on", False), "resolve on")
    check(shardload.resolve_placement(None, "cpu-pinned") == ("cpu", "inferred: CPU offload policy", True), "resolve infer")
    check(shardload.resolve_placement(False, "cpu-pinned")[0] == "device", "resolve off")


# run by pytest (python/tests/unit/test_scripts.py), each as fn(tmp, sd, path); main runs them with --all
SINGLE_PROCESS = ("resolve", "without_torch", "world1", "dlpack_streams")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--all", action="store_true", help="the single-process parts too (python_pytest runs them)")
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    sd, path = checkpoint(a.tmp)
    print(f"libshardload {shardload.version()} from {shardload.library_path()}", flush=True)
    if a.all:  # the single-process parts, which python_pytest runs (unit/test_scripts.py)
        for name in SINGLE_PROCESS:
            globals()[name](a.tmp, sd, path)
    cuda_release_order(a.tmp)
    exit_with_exports(a.tmp, sd, path)  # three interpreters of their own: not a quick unit test
    process_groups(a.tmp, sd, path)
    print(f"test_api: {CHECKS} checks passed", flush=True)


if __name__ == "__main__":
    main()
