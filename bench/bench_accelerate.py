#!/usr/bin/env python3
"""Accelerate's fsdp2_load_full_state_dict against shardload's drop-in, on CPU Gloo worlds.

Side by side in one run, on the same model (python/tests/_model.py's ToyLlama, Hugging Face
naming, an uneven vocab) and the same checkpoint (HF sharded layout), for worlds 2 and 4
(torchrun --standalone --nproc-per-node N, launched by this script as subprocesses):

  accelerate  accelerate.utils.fsdp_utils.fsdp2_load_full_state_dict with rank 0's full state
              dict (rank 0 reads it with safetensors.torch.load_file, as a trainer would)
  dict        shardload.accelerate.fsdp2_load_full_state_dict with the same dict
  path        shardload.accelerate.fsdp2_load_full_state_dict with the checkpoint path

Every job builds the model on the meta device and wraps it with fully_shard per layer and at
the root (as python/tests/test_accelerate_equiv.py does), then loads it once. Measured: the
whole job's wall time (this launcher's clock around torchrun: start-up, imports, rendezvous,
model build, reading, load, teardown), and per rank the load call itself, rank 0's
load_file (dict forms) and peak RSS (getrusage ru_maxrss, after the load). Each rank writes
one JSON record; every local shard's CRC32 is compared between the three variants (and between
repetitions), and the run fails loudly if any differs, so no figure is ever of a wrong load.

    python bench/bench_accelerate.py                    # ~0.65 GiB F32 checkpoint, worlds 2 and 4
    python bench/bench_accelerate.py --small --repeat 1 --warmup 0   # 2.7 MB: ctest bench_accelerate_small
    python bench/bench_accelerate.py --dtype bf16 --json out.json

Needs torch, accelerate and safetensors (exit 77 where they are missing, unless
SHARDLOAD_REQUIRE_TORCH=1), the shardload package (PYTHONPATH=python, or installed) and
libshardload (found by the package, or SHARDLOAD_LIBRARY).
"""

from __future__ import annotations

import time

T_MODULE = time.time()  # a rank's interpreter reached this script (for the start-up share of the wall)

import argparse
import datetime
import json
from math import nan
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python", "tests"))  # _model
sys.path.append(os.path.join(ROOT, "python"))  # shardload, after PYTHONPATH / an installed one

VARIANTS = [
    ("accelerate", "Accelerate, rank 0's dict"),
    ("dict", "drop-in, rank 0's dict"),
    ("path", "drop-in, checkpoint path"),
]
SIZES = {
    # 175.4 M parameters: 0.65 GiB F32 / 0.33 GiB BF16; vocab 32001 divides neither world
    "full": {"vocab": 32001, "h": 1024, "layers": 8},
    # 0.68 M parameters: 2.7 MB F32; vocab 1001 divides neither world
    "small": {"vocab": 1001, "h": 128, "layers": 2},
}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}
MARK = "bench-accelerate.json"


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


# ---- one rank of one job ------------------------------------------------------------------

def worker(a) -> None:
    import traceback
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from _model import ToyLlama

    from torch.distributed.fsdp import CPUOffloadPolicy

    if a.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("gloo" if a.device == "cpu" else f"cpu:gloo,{a.device}:nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        dtype = getattr(torch, DTYPES[a.dtype])
        with torch.device("meta"):
            m = ToyLlama(a.vocab, a.h, a.layers).to(dtype)
        mesh = init_device_mesh(a.device, (world,))
        policy = {"none": None, "cpu": CPUOffloadPolicy(pin_memory=False),
                  "cpu+pin": CPUOffloadPolicy(pin_memory=True)}[a.offload]
        kw = {"mesh": mesh} if policy is None else {"mesh": mesh, "offload_policy": policy}
        for layer in m.model.layers:
            fully_shard(layer, **kw)
        fully_shard(m, **kw)
        dev = torch.device("cpu") if a.device == "cpu" else torch.device(a.device, torch.cuda.current_device())
        accelerator = SimpleNamespace(is_main_process=rank == 0, device=dev)
        if a.worker == "accelerate":
            from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict as load
        else:
            from shardload.accelerate import fsdp2_load_full_state_dict as load
        dist.barrier()
        rss_base = maxrss_mib()
        t0 = time.perf_counter()
        if a.worker == "path":
            full = a.ckpt
        elif rank == 0:  # the trainer's rank 0 reads the whole checkpoint, file by file
            from safetensors.torch import load_file
            with open(os.path.join(a.ckpt, "model.safetensors.index.json")) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
            full = {}
            for fn in files:
                full.update(load_file(os.path.join(a.ckpt, fn)))
        else:
            full = {}  # neither function reads the other ranks' argument
        t1 = time.perf_counter()
        # what Accelerate's fsdp2_prepare_model passes: isinstance(policy, CPUOffloadPolicy)
        out = load(accelerator, m, full, cpu_offload=policy is not None)
        if a.device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        rss_peak = maxrss_mib()
        del full
        t3 = time.perf_counter()
        assert out is m, "the load did not return the model"
        sums = {}
        for k, v in m.state_dict().items():
            local = v.to_local() if isinstance(v, DTensor) else v
            if local.is_meta:
                raise AssertionError(f"rank {rank}: {k} is still on the meta device")
            c = local.detach().contiguous()
            # numpy needs host memory: a cuda mesh's shards are copied to the CPU for the checksum
            crc = zlib.crc32(c.view(torch.uint8).cpu().numpy()) if c.numel() else 0
            sums[k] = [crc, str(c.dtype)[6:], list(c.shape), c.device.type,
                       [str(p) for p in v.placements] if isinstance(v, DTensor) else "plain"]
        t4 = time.perf_counter()
        rec = {"rank": rank, "world": world, "variant": a.worker, "read_s": t1 - t0, "load_s": t2 - t1,
               "check_s": t4 - t3, "rss_base_mib": rss_base, "rss_peak_mib": rss_peak, "sums": sums,
               "device_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if a.device == "cuda" else 0.0,
               # epoch times: script start, load start (before the read), load end
               "t_module": T_MODULE, "t_begin": time.time() - (t4 - t0), "t_loaded": time.time() - (t4 - t2)}
        dist.barrier()
        dist.destroy_process_group()
        rec["t_end"] = time.time()
        tmp = os.path.join(a.out, f".rank{rank}.json")
        with open(tmp, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, os.path.join(a.out, f"rank{rank}.json"))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # never hang in teardown: the launcher reports the failure


# ---- the launcher -------------------------------------------------------------------------

def fail(msg: str) -> None:
    print(f"bench_accelerate: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check_imports() -> None:
    try:
        import accelerate.utils.fsdp_utils  # noqa: F401
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as e:
        print(f"skipped: torch/accelerate/safetensors not importable ({e})", flush=True)
        sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)
    try:
        import shardload  # noqa: F401
        import shardload.accelerate  # noqa: F401
        shardload.Context  # noqa: B018
    except Exception as e:
        fail(f"the shardload package or libshardload cannot be loaded ({type(e).__name__}: {e}); "
             "set PYTHONPATH=python and SHARDLOAD_LIBRARY=/path/to/libshardload.so")


def ensure_checkpoint(d: str, cfg: dict, shards: int) -> dict:
    """Writes the checkpoint (HF sharded layout) unless D already holds this one."""
    want = dict(cfg, shards=shards, seed=1234)
    mark = os.path.join(d, MARK)
    if os.path.exists(mark):
        with open(mark) as f:
            have = json.load(f)
        if have.get("config") == want:
            return have
    import torch

    from _model import reference_state_dict, save_sharded
    t = time.perf_counter()
    if os.path.isdir(d):
        shutil.rmtree(d)
    sd = reference_state_dict(cfg["vocab"], cfg["h"], cfg["layers"], dtype=getattr(torch, DTYPES[cfg["dtype"]]), seed=1234)
    save_sharded(sd, d, shards=shards)
    info = {"config": want, "tensors": len(sd), "bytes": sum(v.numel() * v.element_size() for v in sd.values()),
            "parameters": sum(v.numel() for v in sd.values())}
    del sd
    with open(mark, "w") as f:
        json.dump(info, f)
    print(f"wrote {d}: {info['tensors']} tensors, {info['bytes'] / 2**20:.1f} MiB in {shards} files "
          f"({time.perf_counter() - t:.1f} s)", flush=True)
    return info


def torchrun_cmd(a) -> list[str]:
    if a.torchrun:
        return [a.torchrun]
    exe = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [exe] if os.access(exe, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]


def run_job(a, cfg, world, variant, work) -> dict:
    out = tempfile.mkdtemp(prefix=f"w{world}-{variant}-", dir=work)
    cmd = torchrun_cmd(a) + ["--standalone", f"--nproc-per-node={world}", os.path.abspath(__file__),
                             "--worker", variant, "--ckpt", a.ckpt, "--out", out, "--dtype", cfg["dtype"],
                             "--device", a.device, "--offload", a.offload,
                             "--vocab", str(cfg["vocab"]), "--h", str(cfg["h"]), "--layers", str(cfg["layers"])]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets anyway; without its warning
    t = time.perf_counter()
    e0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=a.job_timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-4000:]
        fail(f"world {world} {variant}: torchrun ran past {a.job_timeout} s\n{tail}")
    wall = time.perf_counter() - t
    e1 = time.time()
    ranks = []
    for r in range(world):
        fn = os.path.join(out, f"rank{r}.json")
        if p.returncode != 0 or not os.path.exists(fn):
            fail(f"world {world} {variant}: torchrun exited {p.returncode}, rank {r} wrote no record\n"
                 f"$ {' '.join(cmd)}\n{p.stdout[-6000:]}")
        with open(fn) as f:
            ranks.append(json.load(f))
    shutil.rmtree(out, ignore_errors=True)
    # where the wall went: launch to the last rank's script start (torchrun, python), to the last
    # rank's load start (imports, rendezvous, model build), the load (read included), after it
    # (checksums, barrier, destroy), the last rank's end to torchrun's exit (interpreter teardown)
    phases = {"start_s": max(r["t_module"] for r in ranks) - e0,
              "setup_s": max(r["t_begin"] for r in ranks) - max(r["t_module"] for r in ranks),
              "load_s": max(r["t_loaded"] for r in ranks) - max(r["t_begin"] for r in ranks),
              "after_s": max(r["t_end"] for r in ranks) - max(r["t_loaded"] for r in ranks),
              "exit_s": e1 - max(r["t_end"] for r in ranks)}
    return {"world": world, "variant": variant, "wall_s": wall, "phases": phases, "ranks": ranks}


def verify(records: list[dict]) -> int:
    """Every job of a world must give every rank the same local shards, bit for bit."""
    checked = 0
    by_world: dict[int, dict] = {}
    for rec in records:
        ref = by_world.setdefault(rec["world"], rec)
        for mine, theirs in zip(rec["ranks"], ref["ranks"]):
            a, b = mine["sums"], theirs["sums"]
            if list(a) != list(b):
                fail(f"world {rec['world']} rank {mine['rank']}: {rec['variant']} and {ref['variant']} "
                     f"load different state-dict keys: {sorted(set(a) ^ set(b))[:5]}")
            bad = [k for k in a if a[k] != b[k]]
            if bad:
                k = bad[0]
                fail(f"world {rec['world']} rank {mine['rank']}: {rec['variant']} loaded {len(bad)} local shards "
                     f"that differ from {ref['variant']}'s, e.g. {k}: [crc32, dtype, shape, device, placements] "
                     f"{a[k]} vs {b[k]}")
            checked += len(a)
    return checked


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def summarise(records: list[dict], worlds: list[int]) -> dict:
    out = {}
    for w in worlds:
        for v, _ in VARIANTS:
            rs = [r for r in records if r["world"] == w and r["variant"] == v and not r["warmup"]]
            if not rs:
                continue
            s = {"runs": len(rs), "wall_s": med([r["wall_s"] for r in rs]),
                 "load_max_s": med([max(x["load_s"] for x in r["ranks"]) for r in rs]),
                 "read0_s": med([r["ranks"][0]["read_s"] for r in rs]),
                 "load_s": [med([r["ranks"][k]["load_s"] for r in rs]) for k in range(w)],
                 "rss_peak_mib": [med([r["ranks"][k]["rss_peak_mib"] for r in rs]) for k in range(w)],
                 "rss_base_mib": [med([r["ranks"][k]["rss_base_mib"] for r in rs]) for k in range(w)],
                 "device_peak_mib": [med([r["ranks"][k].get("device_peak_mib", 0.0) for r in rs]) for k in range(w)],
                 "check_max_s": med([max(x["check_s"] for x in r["ranks"]) for r in rs]),
                 "phases": {k: med([r["phases"][k] for r in rs]) for k in rs[0]["phases"]},
                 "wall_all_s": [r["wall_s"] for r in rs]}
            s["rss_growth_mib"] = [p - b for p, b in zip(s["rss_peak_mib"], s["rss_base_mib"])]
            out[f"{w}/{v}"] = s
    return out


def ratios(summary: dict, worlds: list[int]) -> dict:
    out = {}
    for w in worlds:
        acc = summary.get(f"{w}/accelerate")
        if acc is None:
            continue
        for v in ("dict", "path"):
            s = summary.get(f"{w}/{v}")
            if s is None:
                continue
            out[f"{w}/{v}"] = {
                "wall": acc["wall_s"] / s["wall_s"],
                "load_max": acc["load_max_s"] / s["load_max_s"],
                "rss_peak_rank0": acc["rss_peak_mib"][0] / s["rss_peak_mib"][0],
                # world 1 has no other ranks: nan
                "rss_peak_other_max": max(acc["rss_peak_mib"][1:], default=nan) / max(s["rss_peak_mib"][1:], default=nan),
                "rss_growth_rank0": acc["rss_growth_mib"][0] / max(s["rss_growth_mib"][0], 1.0),
                "rss_growth_other_max": max(acc["rss_growth_mib"][1:], default=nan) / max(max(s["rss_growth_mib"][1:], default=nan), 1.0),
                "device_peak_rank0": acc["device_peak_mib"][0] / max(s["device_peak_mib"][0], 1.0),
            }
    return out


def print_tables(summary: dict, rat: dict, worlds: list[int]) -> None:
    names = dict(VARIANTS)
    print()
    print("| world | variant | wall s | load s (slowest rank) | load s per rank | read0 s | peak RSS MiB per rank | RSS growth MiB per rank |")
    print("|---|---|---|---|---|---|---|---|")
    for w in worlds:
        for v, _ in VARIANTS:
            s = summary.get(f"{w}/{v}")
            if s is None:
                continue
            per = " / ".join(f"{x:.3f}" for x in s["load_s"])
            rss = " / ".join(f"{x:.0f}" for x in s["rss_peak_mib"])
            if any(s["device_peak_mib"]):  # cuda: torch's max allocated device memory, per rank
                rss += " (device " + " / ".join(f"{x:.0f}" for x in s["device_peak_mib"]) + ")"
            grow = " / ".join(f"{x:.0f}" for x in s["rss_growth_mib"])
            read0 = f"{s['read0_s']:.3f}" if v != "path" else "-"
            print(f"| {w} | {names[v]} | {s['wall_s']:.2f} | {s['load_max_s']:.3f} | {per} | {read0} | {rss} | {grow} |")
    print()
    print("Where the wall went (medians; the last rank to reach each point): start = launch to the script "
          "(torchrun, python); setup = imports, rendezvous, meta model, fully_shard; load = rank 0's read + "
          "the load call; after = checksums (for the check), barrier, destroy; exit = interpreter teardown "
          "to torchrun's exit")
    print()
    print("| world | variant | start s | setup s | load s | after s (of it checksums) | exit s |")
    print("|---|---|---|---|---|---|---|")
    for w in worlds:
        for v, _ in VARIANTS:
            s = summary.get(f"{w}/{v}")
            if s is None:
                continue
            ph = s["phases"]
            print(f"| {w} | {names[v]} | {ph['start_s']:.2f} | {ph['setup_s']:.2f} | {ph['load_s']:.2f} | "
                  f"{ph['after_s']:.2f} ({s['check_max_s']:.2f}) | {ph['exit_s']:.2f} |")
    print()
    print("Accelerate / drop-in (above 1: the drop-in is faster or smaller):")
    print()
    print("| world | drop-in form | wall | load (slowest rank) | peak RSS rank 0 | peak RSS other ranks (max) | RSS growth rank 0 | RSS growth other ranks (max) |")
    print("|---|---|---|---|---|---|---|---|")
    for w in worlds:
        for v in ("dict", "path"):
            r = rat.get(f"{w}/{v}")
            if r is None:
                continue
            print(f"| {w} | {v} | {r['wall']:.2f} | {r['load_max']:.2f} | {r['rss_peak_rank0']:.2f} | "
                  f"{r['rss_peak_other_max']:.2f} | {r['rss_growth_rank0']:.2f} | {r['rss_growth_other_max']:.2f} |")
    dev = [(k, r["device_peak_rank0"]) for k, r in rat.items() if r["device_peak_rank0"] > 0]
    if dev:  # cuda meshes: torch's peak device memory on rank 0
        print()
        print("device memory peak, rank 0, Accelerate / drop-in: " + ", ".join(f"{k} {x:.2f}" for k, x in dev))
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a few-MB model (a quick CI-style run)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32", help="checkpoint and parameter dtype (f32)")
    ap.add_argument("--worlds", default="2,4", help="comma-separated world sizes (2,4)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="the meshes' device (cuda: one GPU per rank, NCCL beside Gloo; bench/gpu-check.sh runs world 1)")
    ap.add_argument("--offload", choices=["none", "cpu", "cpu+pin"], default="none",
                    help="the model's FSDP2 offload policy; both functions get cpu_offload=(policy is a CPUOffloadPolicy)")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per world and variant (3); medians")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured rounds first (1): page cache, first touch; still checked")
    ap.add_argument("--dir", default="/tmp/bench-accel", help="checkpoints go in DIR/{full,small}-DTYPE (/tmp/bench-accel)")
    ap.add_argument("--shards", type=int, default=4, help="checkpoint files (4)")
    ap.add_argument("--json", help="write every measurement, the medians and the ratios here")
    ap.add_argument("--torchrun", help="torchrun executable (default: next to this python, else -m torch.distributed.run)")
    ap.add_argument("--job-timeout", type=float, default=600.0, help="seconds per torchrun job (600)")
    # worker mode (internal: the launcher runs the script under torchrun with these)
    ap.add_argument("--worker", choices=[v for v, _ in VARIANTS], help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--h", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    check_imports()
    worlds = [int(x) for x in a.worlds.split(",") if x]
    if a.repeat < 1 or a.warmup < 0 or not worlds or min(worlds) < 1:
        ap.error("--repeat >= 1, --warmup >= 0, worlds >= 1 (world 1: no other ranks to compare with rank 0)")
    size = "small" if a.small else "full"
    cfg = dict(SIZES[size], dtype=a.dtype)
    a.ckpt = os.path.join(a.dir, f"{size}-{a.dtype}")
    os.makedirs(a.dir, exist_ok=True)
    started = time.perf_counter()
    load0 = os.getloadavg()
    info = ensure_checkpoint(a.ckpt, cfg, a.shards)
    print(f"checkpoint {a.ckpt}: ToyLlama vocab {cfg['vocab']} h {cfg['h']} layers {cfg['layers']} {a.dtype}, "
          f"{info['tensors']} tensors, {info['bytes'] / 2**20:.1f} MiB; worlds {worlds}, "
          f"{a.warmup} warm-up + {a.repeat} measured rounds of {len(VARIANTS)} variants", flush=True)
    work = tempfile.mkdtemp(prefix="bench-accel-", dir=a.dir)
    records = []
    try:
        for w in worlds:
            for rnd in range(a.warmup + a.repeat):
                for v, _ in VARIANTS:  # variants interleaved, so drifting load hits all three alike
                    rec = run_job(a, cfg, w, v, work)
                    rec["warmup"] = rnd < a.warmup
                    rec["round"] = rnd
                    records.append(rec)
                    print(f"  world {w} round {rnd}{' (warm-up)' if rec['warmup'] else ''} {v:10s} "
                          f"wall {rec['wall_s']:6.2f} s  load {max(x['load_s'] for x in rec['ranks']):6.3f} s  "
                          f"peak RSS rank 0 {rec['ranks'][0]['rss_peak_mib']:7.0f} MiB  ("
                          + " ".join(f"{k[:-2]} {x:.2f}" for k, x in rec["phases"].items()) + ")", flush=True)
                verify(records)  # fail as soon as a round disagrees
    finally:
        shutil.rmtree(work, ignore_errors=True)
    checked = verify(records)
    summary = summarise(records, worlds)
    rat = ratios(summary, worlds)
    elapsed = time.perf_counter() - started
    print(f"\ncorrectness: {checked} local shards (every rank, job and variant) bit-identical (CRC32, dtype, "
          f"shape, device, placements) to Accelerate's load", flush=True)
    print_tables(summary, rat, worlds)
    load1 = os.getloadavg()
    print(f"{elapsed:.0f} s in all; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end "
          f"({os.cpu_count()} CPUs)", flush=True)
    if a.json:
        import accelerate
        import torch
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"node": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
                        "processor": platform.processor(), "loadavg_start": load0, "loadavg_end": load1},
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "accelerate": accelerate.__version__},
            "command": sys.argv,
            "checkpoint": dict(info, path=a.ckpt),
            "worlds": worlds, "repeat": a.repeat, "warmup": a.warmup,
            "medians": summary, "ratios": rat, "seconds": elapsed,
            "runs": [dict(r, ranks=[{k: v for k, v in x.items() if k != "sums"} for x in r["ranks"]]) for r in records],
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {a.json}", flush=True)


if __name__ == "__main__":
    main()
