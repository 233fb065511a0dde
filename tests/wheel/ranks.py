"""One rank of the wheel check's world-2 job (tests/wheel/check.sh), run under torchrun inside
the minimal root against the wheel's package: a plain load (shardload.Context over torch's
Gloo group) and the Accelerate drop-in into an FSDP2 ToyLlama, each rank's local shards saved
for the comparison outside the root (against torch.chunk of the checkpoint's tensors).
    ranks.py CKPT_DIR OUT_DIR MODEL_PY_DIR
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import shardload
from shardload.accelerate import fsdp2_load_full_state_dict

ckpt, out, model_dir = sys.argv[1:4]
sys.path.insert(0, model_dir)
from _model import ToyLlama  # noqa: E402

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
# the wheel's own library, not a build tree's or $SHARDLOAD_LIBRARY's
where = os.path.dirname(shardload.library_path())
assert where.endswith(os.path.join("site-packages", "shardload", "_lib")), where

with shardload.Context() as ctx:  # the initialised group's rank, world and store
    plan = ctx.plan(mesh=[world])
    state = ctx.load(plan, ctx.open(ckpt))
    plain = {k: t.to_torch().clone() for k, t in state.items()}
save_file(plain, os.path.join(out, f"plain-{rank}.safetensors"))

with torch.device("meta"):
    model = ToyLlama()
mesh = init_device_mesh("cpu", (world,))
for block in model.model.layers:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
fsdp2_load_full_state_dict(None, model, ckpt)
drop_in = {k: v.to_local().contiguous() for k, v in model.state_dict().items()}
save_file(drop_in, os.path.join(out, f"dropin-{rank}.safetensors"))
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank}/{world}: {len(plain)} plain, {len(drop_in)} drop-in tensors from {where}")
