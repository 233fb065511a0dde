"""Load a checkpoint into an FSDP2 model with shardload's drop-in for Accelerate.

    torchrun --nproc-per-node 2 examples/fsdp2_load.py [CHECKPOINT] [--offload]

CHECKPOINT: a .safetensors file, a model.safetensors.index.json or a directory holding one,
whose names match the model below; without it rank 0 writes one to a temporary directory.
--offload wraps the model with CPUOffloadPolicy: the shards then land on the CPU (the
contract's "inferred" row). Runs on CPU with Gloo, or on GPUs (one per rank) with NCCL.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from shardload.accelerate import fsdp2_load_full_state_dict, last_load_report


class Net(nn.Module):
    def __init__(self, vocab=1001, h=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))
                                    for _ in range(layers))
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    offload = "--offload" in sys.argv
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    ckpt = args[0] if args else None
    if ckpt is None:  # a checkpoint to load: rank 0 writes one, every rank learns its path
        from safetensors.torch import save_file
        box = [None]
        if rank == 0:
            box[0] = os.path.join(tempfile.mkdtemp(prefix="fsdp2-load-"), "model.safetensors")
            save_file(Net().state_dict(), box[0])
        dist.broadcast_object_list(box, src=0)
        ckpt = box[0]

    # the model on the meta device: no rank allocates its full weights
    with torch.device("meta"):
        model = Net()
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    kw = {"mesh": mesh}
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=cuda)
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)

    # every rank reads nothing but its shard's bytes from rank 0: cpu_offload None = the policy decides
    fsdp2_load_full_state_dict(None, model, ckpt)

    w = model.embed.weight
    r = last_load_report()["embed.weight"]
    print(f"rank {rank}: embed.weight global {tuple(w.shape)}, local {tuple(w.to_local().shape)} on "
          f"{w.to_local().device} ({r['rule']}; {r['backend']}/{r['collective']})", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1001, (4, 16), device="cuda" if cuda else "cpu")
    loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"one step: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
