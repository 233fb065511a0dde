#!/usr/bin/env python3
"""Cross-check shardload against the real reference implementations: PyTorch DTensor's shard
geometry (compute_local_shape_and_global_offset on a fake process group) and torch's casts
(Tensor.to), on a checkpoint written by the real `safetensors` package.

For each configuration, `shardload load --nproc N --dump DIR` runs on local ranks; every rank's
dump is read back with safetensors.torch and compared bit for bit with the slice torch computes.
Skips (exit 77) when torch or safetensors is not installed: they are large optional downloads,
kept out of the build.

    python3 tests/crosscheck/torch_dtensor.py --bin build/cpu/shardload --tmp /tmp/xc
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.testing._internal.distributed.fake_pg import FakeStore
except Exception as e:  # pragma: no cover - environment without the references
    print(f"skipped: torch/safetensors not importable ({e})")
    # CI and scripts/test.sh install the reference packages: missing there is a failure
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)


def make_checkpoint(path):
    g = torch.Generator().manual_seed(1234)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, 3.4e38,
                            1.00390625, 1.01171875, 65519.0, 65520.0, -2.5e-8], dtype=torch.float32)
    t = {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(10, 12, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(9, 7, generator=g).to(torch.float16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(3, 5, generator=g).double(),
        "model.layers.0.input_layernorm.weight": torch.rand(16, generator=g) + 0.5,
        "model.layers.0.special": special.repeat(3),
        "model.layers.0.colwise.weight": torch.randn(4, 11, generator=g).to(torch.bfloat16),
        "model.rotary.scale": torch.tensor(0.125),
        "model.position_ids": torch.arange(13, dtype=torch.int64),
        "model.mask": torch.rand(6, 2, generator=g) > 0.5,
        "model.empty": torch.zeros(0, 3),
        "model.q.fp8": torch.randn(8, 4, generator=g).to(torch.float8_e4m3fn),
    }
    save_file(t, path, metadata={"format": "pt"})
    return t


FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def placements_for(name, ndim, mesh_shape, colwise_dim1):
    """The plan the shardload command is given below, written as DTensor placements."""
    if ndim == 0 or "norm" in name:
        return [Replicate()] * len(mesh_shape)
    d = 1 if (colwise_dim1 and "colwise" in name) else 0
    if len(mesh_shape) == 1:
        return [Shard(d)]
    return [Replicate(), Shard(d)]  # HSDP


def expected_geometry(shape, mesh_shape, placements, world):
    """DTensor's own answer for every rank, one fake process group per rank."""
    out = []
    for r in range(world):
        dist.init_process_group("fake", store=FakeStore(), rank=r, world_size=world)
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        out.append(compute_local_shape_and_global_offset(tuple(shape), mesh, placements))
        dist.destroy_process_group()
    return out


def bits(t):
    """A view on which equality means bit-identical (NaN payloads included)."""
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def run_config(args, ckpt, tensors, world, mesh_shape, param, strategy, source, results):
    label = f"world {world} mesh {mesh_shape} param {param or 'file'} {strategy} {source}"
    dump = os.path.join(args.tmp, "dump")
    shutil.rmtree(dump, ignore_errors=True)
    cmd = [args.bin, "load", ckpt, "--nproc", str(world), "--backend", "cpu", "--cpu-offload", "on",
           "--replicate", "*norm*", "--strategy", strategy, "--source", source, "--dump", dump,
           "--staging", "4096"]
    if len(mesh_shape) > 1:
        cmd += ["--mesh", "x".join(map(str, mesh_shape)), "--plan", args.hsdp_plan]
    else:
        cmd += ["--plan", args.fsdp_plan]
    if param:
        cmd += ["--param-dtype", param]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        results.append((label, f"load failed: {p.stderr.strip()}"))
        return
    geo_cache = {}
    for r in range(world):
        got = load_file(os.path.join(dump, f"rank-{r}.safetensors"))
        for name, full in tensors.items():
            pl = placements_for(name, full.dim(), mesh_shape, True)
            key = (tuple(full.shape), tuple(map(str, pl)))
            if key not in geo_cache:
                geo_cache[key] = expected_geometry(full.shape, mesh_shape, pl, world)
            shape, offset = geo_cache[key][r]
            index = tuple(slice(o, o + s) for o, s in zip(offset, shape))
            want = full[index] if full.dim() else full
            if param and full.dtype in FLOATS:
                want = want.to(DTYPES[param])
            have = got.get(name)
            what = f"{label}: rank {r}: {name}"
            if have is None:
                results.append((what, "missing from the dump"))
            elif have.dtype != want.dtype or tuple(have.shape) != tuple(want.shape):
                results.append((what, f"{have.dtype}{list(have.shape)} vs torch {want.dtype}{list(want.shape)}"))
            elif not torch.equal(bits(have), bits(want)):
                results.append((what, "data differs from torch"))
            else:
                results.append((what, None))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the shardload command")
    ap.add_argument("--tmp", required=True, help="scratch directory")
    args = ap.parse_args()
    shutil.rmtree(args.tmp, ignore_errors=True)
    os.makedirs(args.tmp)
    ckpt = os.path.join(args.tmp, "model.safetensors")
    tensors = make_checkpoint(ckpt)
    args.fsdp_plan = os.path.join(args.tmp, "fsdp.json")
    args.hsdp_plan = os.path.join(args.tmp, "hsdp.json")
    with open(args.fsdp_plan, "w") as f:
        json.dump({"rules": [{"match": "*colwise*", "placement": "shard(1)"}]}, f)
    with open(args.hsdp_plan, "w") as f:
        json.dump({"rules": [{"match": "*colwise*", "placement": "[replicate, shard(1)]"}]}, f)
    results = []
    for world, mesh in ((3, [3]), (4, [4]), (4, [2, 2])):
        for param in (None, "F32", "BF16", "F16"):
            run_config(args, ckpt, tensors, world, mesh, param, "scatter", "rank0", results)
        run_config(args, ckpt, tensors, world, mesh, "BF16", "broadcast", "rank0", results)
        run_config(args, ckpt, tensors, world, mesh, "F32", "scatter", "every-rank", results)
    failed = [(w, why) for w, why in results if why]
    for w, why in failed[:20]:
        print(f"FAIL {w}: {why}")
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
