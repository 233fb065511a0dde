"""A drop-in for Accelerate's fsdp2_load_full_state_dict, loading through libshardload: a thin
adapter over shardload.torch.load_model.

    from shardload.accelerate import fsdp2_load_full_state_dict, patch
    patch()   # Accelerate's own FSDP2 preparation now loads through shardload

Contract (the corrected override, docs/DESIGN.md#placement):
- callable positionally with three arguments (legacy Accelerate) and with the `cpu_offload`
  keyword (Accelerate >= 1.14); True = CPU, False = the accelerator, None = inferred from the
  model's FSDP2 offload policy (CPUOffloadPolicy: CPU, pinned when its pin_memory is set; no
  policy: the accelerator), applied to every FSDP2 parameter on every rank. Entries FSDP2
  does not manage (buffers, plain tensors) load with cpu_offload=False, on the mesh's device,
  where fully_shard keeps them, whatever cpu_offload says (docs/DESIGN.md#placement).
- the plan is read from model.state_dict(): each DTensor's mesh and placements, plain tensors
  replicated on every rank, each entry's dtype (a floating checkpoint tensor other than
  float8_e4m3fn is cast to it, as Accelerate does; an integer/bool one too, where its values
  fit; float8_e4m3fn keeps the checkpoint's dtype).
- full_sd: rank 0's state dict (the other ranks' argument is ignored), or a path to a
  checkpoint (.safetensors, index.json or directory): the fast path, no rank ever holds the
  full dict.
- results are assigned as DTensors on the parameters' meshes (load_state_dict(assign=True)),
  loaded straight into freshly allocated local shards, or in place into the parameters' own
  local storage when it already has the placement, dtype and shape (a materialised model).
- every failure is one error on every rank (ShardloadError), never a hang: a key missing on
  either side, a checkpoint tensor whose shape differs from its entry's ("size mismatch", as
  torch's load_state_dict names it, both shapes given), an entry that is not a tensor, a mesh
  shardload cannot express.
"""

from __future__ import annotations

import sys
import threading

import torch

from shardload import torch as _slt
from shardload.torch import _report  # the same dict: last_load_report() tells of the last load

__all__ = ["fsdp2_load_full_state_dict", "patch", "unpatch", "is_patched", "last_load_report"]


def last_load_report() -> dict[str, dict]:
    """This rank's account of the last load: per state-dict key, the device the shard is on
    (torch's name: "cpu", "cuda:1"), where the contract placed it ("placed": "cpu" or "device"),
    the placement rule that chose it, pinned, loaded in place into the parameter's
    own storage or not, and the backend/collective used."""
    return dict(_report)


def fsdp2_load_full_state_dict(accelerator, model: torch.nn.Module, full_sd, cpu_offload: bool | None = None):
    """Loads the full state dict (rank 0's dict, or a checkpoint path) into the FSDP2-sharded MODEL
    through shardload. cpu_offload: True = CPU, False = accelerator, None = the model's policy.

    shardload.torch.load_model with Accelerate's semantics: the default group, the
    accelerator's device, a key the checkpoint lacks fails, a key the model lacks is ignored;
    returns the model."""
    _slt._load_model(model, full_sd, cpu_offload=cpu_offload, device=getattr(accelerator, "device", None),
                     accelerate=True)
    return model


# ---- patching Accelerate -----------------------------------------------------------------

_patch_lock = threading.Lock()
_patched: list[tuple[object, str, object]] = []


def patch() -> None:
    """Installs the drop-in wherever Accelerate's fsdp2_load_full_state_dict is bound (its
    defining module, accelerate.utils and any module that imported it by name)."""
    import accelerate.utils.fsdp_utils as fu
    with _patch_lock:
        if _patched:
            return
        original = fu.fsdp2_load_full_state_dict
        for mod in list(sys.modules.values()):
            name = getattr(mod, "__name__", "") or ""
            if not name.startswith("accelerate"):
                continue
            if getattr(mod, "fsdp2_load_full_state_dict", None) is original:
                _patched.append((mod, "fsdp2_load_full_state_dict", original))
                setattr(mod, "fsdp2_load_full_state_dict", fsdp2_load_full_state_dict)


def unpatch() -> None:
    """Puts Accelerate's own function back where patch() replaced it."""
    with _patch_lock:
        while _patched:
            mod, attr, original = _patched.pop()
            setattr(mod, attr, original)


def is_patched() -> bool:
    return bool(_patched)
