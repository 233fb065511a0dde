"""README.md's "PyTorch users" snippets, run as the program they make, under torchrun at world 2.

    python python/tests/test_readme_torch.py --tmp DIR [--readme README.md]

Every ```python block of that section, in order, is one program; this writes the checkpoint
it reads ($CKPT: the weights of the section's model, nn.Sequential of four Linear(64, 64)),
appends checks of what the snippets loaded (against the checkpoint, load_sharded against
distribute_tensor) and runs it under torchrun at world 2. A snippet that no longer runs, or
loads something else, fails here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SECTION = "## PyTorch users"

# appended to the snippets: what they loaded is what the checkpoint holds
CHECKS = '''
# ---- test_readme_torch.py's checks, appended to the README's snippets
from safetensors.torch import load_file as _load_file
from torch.distributed.tensor import DTensor as _DTensor, distribute_tensor as _distribute

_full = _load_file(os.environ["CKPT"])
assert (missing, unexpected) == ([], []), (missing, unexpected)
assert sorted(model.state_dict()) == sorted(_full), sorted(model.state_dict())
for _k, _v in model.state_dict().items():
    assert isinstance(_v, _DTensor) and torch.equal(_v.full_tensor(), _full[_k]), _k
for _k, _v in sd.items():
    assert _v.placements == (Shard(0),), (_k, _v.placements)
    assert torch.equal(_v.to_local(), _distribute(_full[_k], mesh, [Shard(0)]).to_local()), _k
assert rowwise["0.weight"].placements == (Shard(1),) and rowwise["0.bias"].placements == (Replicate(),)
for _k, _v in rowwise.items():
    _want = _distribute(_full[_k].to(torch.bfloat16), mesh, _v.placements).to_local()
    assert _v.dtype == torch.bfloat16 and torch.equal(_v.to_local(), _want), _k
dist.barrier()
if dist.get_rank() == 0:
    print("README PyTorch users snippets: ran, and loaded what the checkpoint holds", flush=True)
dist.destroy_process_group()
'''


def snippets(readme: str) -> list[str]:
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    start = text.find("\n" + SECTION + "\n")
    if start < 0:
        raise SystemExit(f"{readme}: no '{SECTION}' section")
    end = text.find("\n## ", start + len(SECTION) + 2)
    body = text[start: end if end >= 0 else len(text)]
    blocks = re.findall(r"^```python\n(.*?)^```", body, flags=re.S | re.M)
    if not blocks:
        raise SystemExit(f"{readme}: the '{SECTION}' section has no python snippet")
    return blocks


def write_checkpoint(path: str) -> None:
    """The weights of the section's model, saved as safetensors.torch.save_model would."""
    import torch
    from safetensors.torch import save_file
    from torch import nn
    torch.manual_seed(18)
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4)))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)


def main() -> int:
    try:
        import accelerate  # noqa: F401
        import safetensors  # noqa: F401
        import torch  # noqa: F401
    except Exception as e:
        print(f"skipped: torch/accelerate/safetensors not importable ({e})")
        return 1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77
    ap = argparse.ArgumentParser()
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--readme", default=os.path.join(HERE, "..", "..", "README.md"))
    a = ap.parse_args()
    os.makedirs(a.tmp, exist_ok=True)
    blocks = snippets(a.readme)
    program = os.path.join(a.tmp, "readme_pytorch_users.py")
    with open(program, "w", encoding="utf-8") as f:
        f.write("\n".join(blocks) + CHECKS)
    ckpt = os.path.join(a.tmp, "model.safetensors")
    write_checkpoint(ckpt)
    print(f"{len(blocks)} snippets of '{SECTION}' as {program}", flush=True)
    env = dict(os.environ, CKPT=ckpt)
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            program], env=env, timeout=540)


if __name__ == "__main__":
    sys.exit(main())
