"""A drop-in for Accelerate's fsdp2_load_full_state_dict, loading through libshardload.

    from shardload.accelerate import fsdp2_load_full_state_dict, patch
    patch()   # Accelerate's own FSDP2 preparation now loads through shardload

Contract (the corrected override, docs/DESIGN.md#placement):
- callable positionally with three arguments (legacy Accelerate) and with the `cpu_offload`
  keyword (Accelerate >= 1.14); True = CPU, False = the accelerator, None = inferred from the
  model's FSDP2 offload policy (CPUOffloadPolicy: CPU, pinned when its pin_memory is set; no
  policy: the accelerator). The same rule for every tensor, on every rank, sharded or not.
- the plan is read from model.state_dict(): each DTensor's mesh and placements, plain tensors
  replicated on every rank, each entry's dtype (a floating checkpoint tensor other than
  float8_e4m3fn is cast to it, as Accelerate does; others keep the checkpoint's dtype).
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

import logging
import os
import sys
import threading
from collections import defaultdict
from collections.abc import Mapping

import torch

import shardload
from shardload import _torch as _t

_log = logging.getLogger("shardload.accelerate")
_UNSET = object()

__all__ = ["fsdp2_load_full_state_dict", "patch", "unpatch", "is_patched", "last_load_report"]

_report: dict[str, dict] = {}


def last_load_report() -> dict[str, dict]:
    """This rank's account of the last load: per state-dict key, where the shard went ("cpu" or
    "device"), the placement rule that chose it, pinned, loaded in place into the parameter's
    own storage or not, and the backend/collective used."""
    return dict(_report)


def _fsdp_policies(model) -> dict[int, object]:
    """id(parameter) -> the offload policy of the FSDP2 group that manages it."""
    out = {}
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return out
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        state = m._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.15: several per module
        if groups is None:
            pg = getattr(state, "_fsdp_param_group", None)
            groups = [pg] if pg is not None else []
        for pg in groups:
            for fp in pg.fsdp_params:
                out[id(fp.sharded_param)] = pg.offload_policy
    return out


def _policy_key(policy) -> str:
    if policy is None or type(policy).__name__ != "CPUOffloadPolicy":
        return "none"
    return "cpu+pin" if getattr(policy, "pin_memory", True) else "cpu"


def _placement_spec(name, placements) -> str:
    parts = []
    for p in placements:
        if type(p).__name__ == "Shard" and p.is_shard():
            parts.append(f"shard({p.dim})")
        elif p.is_replicate():
            parts.append("replicate")
        else:
            raise ValueError(f"'{name}': placement {p} is not Shard or Replicate; shardload loads full "
                             "checkpoints into Shard/Replicate DTensors only")
    return "[" + ", ".join(parts) + "]"


class _Entry:
    __slots__ = ("key", "value", "mesh", "placements", "spec", "policy", "dt_target", "dt_load",
                 "aliases", "src_key", "local", "fresh")

    def __init__(self, key, value):
        self.key, self.value = key, value
        self.mesh = self.placements = self.spec = None
        self.aliases = ()   # other state-dict names of the same tensor (tied weights)
        self.src_key = None  # the checkpoint name it loads from: its own, else an alias's
        self.local = self.fresh = None


def _plan_entries(model, world: int):
    """The model's state dict as load entries: mesh, placements, offload policy, tied names."""
    from torch.distributed.tensor import DTensor
    sd = model.state_dict()
    policies = _fsdp_policies(model)
    params = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        params[fqn] = p
    for fqn, b in model.named_buffers(remove_duplicate=False):
        params.setdefault(fqn, b)
    model_policy = {_policy_key(p) for p in policies.values()}
    default_policy = model_policy.pop() if len(model_policy) == 1 else "none"
    entries = []
    names_of = defaultdict(list)
    for key in sd:
        if key in params:
            names_of[id(params[key])].append(key)
    for key, v in sd.items():
        e = _Entry(key, v)
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"model.state_dict()['{key}'] is a {type(v).__name__}, not a tensor")
        p = params.get(key)
        if p is not None:  # tied weights: one tensor under several names
            e.aliases = tuple(n for n in names_of[id(p)] if n != key)
        e.policy = _policy_key(policies[id(p)]) if p is not None and id(p) in policies else default_policy
        if isinstance(v, DTensor):
            mesh = v.device_mesh
            ranks = mesh.mesh.flatten().tolist()
            if ranks != list(range(world)):
                raise ValueError(f"'{key}': its device mesh holds ranks {ranks[:8]}{'...' if len(ranks) > 8 else ''}; "
                                 f"shardload loads onto meshes over all {world} ranks in order")
            e.mesh, e.placements = mesh, v.placements
            e.spec = _placement_spec(key, v.placements)
        else:
            e.spec = "replicate"
        entries.append(e)
    return entries


def _device_type(entries) -> str:
    kinds = {e.mesh.device_type for e in entries if e.mesh is not None}
    if len(kinds) > 1:
        raise ValueError(f"the model's meshes are on several device types {sorted(kinds)}")
    return kinds.pop() if kinds else "cpu"


def _local_device(dev_type: str, accelerator):
    if dev_type == "cpu":
        return torch.device("cpu")
    mod = getattr(torch, dev_type, None)
    dev = getattr(accelerator, "device", None)
    if isinstance(dev, torch.device) and dev.type == dev_type and dev.index is not None:
        return dev
    # the device torch allocates on ("cuda" alone means the current one): the library's too
    idx = mod.current_device() if mod is not None and hasattr(mod, "current_device") else 0
    return torch.device(dev_type, idx)


def _reusable(e, want_device: torch.device, pinned: bool):
    """The parameter's own local storage, where it can take the shard in place."""
    v = e.value
    local = v.to_local() if hasattr(v, "to_local") else v
    if local.is_meta or not local.is_contiguous() or local.dtype != _t.torch_dtype(e.dt_load):
        return None
    if local.device.type != want_device.type or (want_device.index is not None and local.device.index != want_device.index):
        return None
    if want_device.type == "cpu" and pinned and not local.is_pinned():
        return None
    return local


def _signature(entries) -> list:
    return [(e.key, e.spec, tuple(e.mesh.mesh.shape) if e.mesh is not None else None, e.policy,
             str(e.value.dtype), tuple(e.value.shape)) for e in entries]


def _same_plan_everywhere(dist, world, path, entries):
    """One exchange over the torch group: rank 0's full_sd form (it decides for every rank), and
    the model.state_dict() each rank plans from. Ranks whose models differ would make different
    loads and wait for each other; they fail together instead, every rank naming the first rank
    that differs from rank 0 and the first entry where it does."""
    import hashlib
    sig = _signature(entries) if entries is not None else None
    digest = hashlib.sha256(repr(sig).encode()).hexdigest() if sig is not None else None
    everyone = [None] * world
    dist.all_gather_object(everyone, (path, digest))
    path = everyone[0][0]
    bad = next((r for r in range(1, world) if everyone[r][1] not in (everyone[0][1], None)
                and everyone[0][1] is not None), None)
    if bad is None:
        return path, None
    sigs = [None] * world  # the whole signatures, only when they differ
    dist.all_gather_object(sigs, sig)
    a, b = sigs[0], sigs[bad]
    i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    where = (f"entry {i}: rank 0 has {a[i] if i < len(a) else 'nothing'}, rank {bad} has "
             f"{b[i] if i < len(b) else 'nothing'}")
    return path, shardload.ShardloadError(16, f"rank {bad}'s model.state_dict() differs from rank 0's "
                                              f"({len(b)} and {len(a)} entries; {where}): every rank must "
                                              "load the same model")


def _check_shapes(entries, src, path):
    """Every entry's checkpoint tensor has the entry's global shape. The plan takes the shape
    from the checkpoint, so a [3, 6] tensor for a [4, 6] parameter would load 3 rows into a
    DTensor that claims 4, and forward would run on it; torch's load_state_dict refuses it as
    "size mismatch", and so does this. Every rank checks the same tables (rank 0's checkpoint,
    the models agreed equal), inside the step whose outcome the ranks agree on."""
    have = {e.key: tuple(src[e.src_key].shape) for e in entries}
    bad = [(e, have[e.key]) for e in entries if have[e.key] != tuple(e.value.shape)]
    if not bad:
        return
    where = f"the checkpoint {path}" if path is not None else "full_sd"

    def one(e, have):
        alias = f" (saved as {e.src_key})" if e.src_key != e.key else ""
        return (f"size mismatch for {e.key}{alias}: copying a param with shape {list(have)} from checkpoint, "
                f"the shape in current model is {list(e.value.shape)}")
    more = f"; {len(bad) - 3} more" if len(bad) > 3 else ""
    raise ValueError(f"{where}: {len(bad)} of its tensors differ in shape from model.state_dict(): "
                     + "; ".join(one(e, have) for e, have in bad[:3]) + more
                     + ". Load the checkpoint this model was built for, or build the model to its shapes")


def _load(accelerator, model, full_sd, cpu_offload):
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    # rank 0's full_sd decides the form (the other ranks' argument is ignored): a path, or its dict
    path = os.fspath(full_sd) if isinstance(full_sd, (str, os.PathLike)) else None
    dev_type = "cpu"
    err = None
    try:
        entries = _plan_entries(model, world)
        dev_type = _device_type(entries)
    except Exception as e:  # agreed below, once a context exists
        err, entries = e, []
    if world > 1:
        path, mismatch = _same_plan_everywhere(dist, world, path, entries if err is None else None)
        err = err or mismatch
    backend = "cpu" if dev_type == "cpu" else "auto"
    dev = _local_device(dev_type, accelerator)
    _report.clear()
    results = {}
    with shardload.Context(backend, device=dev.index if dev.type != "cpu" else None) as ctx:
        ctx.agree(err if err is not None else True)
        if path is not None:
            src = ctx.open(path)
        else:
            sd = None
            if ctx.rank == 0 and isinstance(full_sd, Mapping):
                # only what the model names: extra entries are ignored, as Accelerate ignores them
                wanted = {e.key for e in entries} | {a for e in entries for a in e.aliases}
                sd = {k: v for k, v in full_sd.items() if k in wanted}
            elif ctx.rank == 0:
                sd = full_sd  # not a mapping: open_state_dict names the problem on every rank
            src = ctx.open_state_dict(sd, label="full_sd (rank 0's state dict)")
        with src:
            # checkpoint dtypes decide the casts, as on Accelerate's rank 0
            err = None
            try:
                for e in entries:
                    e.src_key = e.key if e.key in src else next((a for a in e.aliases if a in src), None)
                missing = [e.key for e in entries if e.src_key is None]
                if missing:
                    raise KeyError(f"{len(missing)} model.state_dict() entries are not in "
                                   f"{'the checkpoint ' + path if path is not None else 'full_sd'}: "
                                   f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")
                _check_shapes(entries, src, path)
                for e in entries:
                    fdt = src[e.src_key].dtype
                    want = _t.dtype_name(e.value.dtype)
                    floating = fdt in ("F64", "F32", "F16", "BF16", "F8_E5M2")
                    e.dt_target = want if floating else fdt
                    # shardload casts among F64/F32/F16/BF16; a rare other cast is torch's, after the load
                    e.dt_load = e.dt_target if (fdt in _t.CASTABLE and e.dt_target in _t.CASTABLE) else fdt
            except Exception as ex:
                err = ex
            ctx.agree(err if err is not None else True)
            host_backend = ctx.backend == "cpu"
            groups = defaultdict(list)
            for e in entries:
                if e.src_key == e.key:  # the others take their alias's shard
                    shape = tuple(e.mesh.mesh.shape) if e.mesh is not None else None
                    # plain entries (buffers, parameters FSDP2 ignores) are not offloaded by FSDP2:
                    # fully_shard keeps them on the mesh's device, and so does the drop-in
                    groups[(shape, "plain" if e.mesh is None else e.policy)].append(e)
            for (shape, policy), group in groups.items():
                plain = policy == "plain"
                plan = ctx.plan(mesh=list(shape) if shape else [world],
                                offload_policy=policy if policy not in ("none", "plain") else None)
                for e in group:
                    plan.add_entry(e.key, e.spec, e.dt_load)
                by_key = {e.key: e for e in group}

                def bind(t, by_key=by_key):
                    e = by_key[t.name]
                    cpu = t.dlpack_device[0] in (1, 3, 11)
                    want = torch.device("cpu") if cpu else dev
                    local = e.value.to_local() if hasattr(e.value, "to_local") else e.value
                    reuse = _reusable(e, want, t.pinned) if tuple(local.shape) == t.local_shape else None
                    if reuse is not None:
                        e.local = reuse
                        return reuse
                    buf = torch.empty(t.local_shape, dtype=_t.torch_dtype(t.dtype), device=want,
                                      pin_memory=bool(cpu and t.pinned and torch.cuda.is_available()))
                    e.local = e.fresh = buf
                    return buf

                state = ctx.load(plan, src, cpu_offload=False if plain else cpu_offload, bind=bind)
                err = None
                try:
                    if dev.type == "cuda":
                        # sl_load returns with its streams drained; this also orders torch's
                        # streams after every write to the tensors torch allocated
                        torch.cuda.synchronize(dev)
                    for e in group:
                        t = state[e.key]
                        _report[e.key] = {"device": t.device, "rule": t.rule, "pinned": t.pinned,
                                          "in_place": e.local is not None and e.local is not e.fresh,
                                          "backend": ctx.backend, "collective": ctx.collective}
                        if plain:
                            _report[e.key]["note"] = "not an FSDP2 parameter: on the mesh's device, as fully_shard keeps it"
                        local = e.local
                        if t.device == "device" and host_backend and dev.type != "cpu":
                            local = local.to(dev)  # no device backend here: staged through host memory
                        if e.dt_load != e.dt_target:
                            local = local.to(_t.torch_dtype(e.dt_target))
                        results[e.key] = local
                        e.local = e.fresh = None
                except Exception as ex:  # e.g. out of memory on one rank: every rank stops here
                    err = ex
                state.close()
                del state
                plan.close()
                ctx.agree(err if err is not None else True)
        err = None
        try:
            sharded_sd = {}
            for e in entries:
                if e.key not in results:
                    _report[e.key] = dict(_report[e.src_key], alias_of=e.src_key)
                local = results[e.key] if e.key in results else results[e.src_key]
                if e.mesh is not None:
                    sharded_sd[e.key] = DTensor.from_local(local, e.mesh, e.placements, run_check=False,
                                                           shape=e.value.shape, stride=e.value.stride())
                else:
                    sharded_sd[e.key] = local
            results.clear()
            # FSDP2 re-pads uneven shards and pins under a pinned policy here (reset_sharded_param)
            model.load_state_dict(sharded_sd, assign=True)
        except Exception as ex:
            err = ex
        ctx.agree(err if err is not None else True)
    return model


def fsdp2_load_full_state_dict(accelerator, model: torch.nn.Module, full_sd, cpu_offload: bool | None = None):
    """Loads the full state dict (rank 0's dict, or a checkpoint path) into the FSDP2-sharded MODEL
    through shardload. cpu_offload: True = CPU, False = accelerator, None = the model's policy."""
    if cpu_offload is not None and not isinstance(cpu_offload, bool):
        raise TypeError(f"cpu_offload must be True, False or None, not {cpu_offload!r}")
    return _load(accelerator, model, full_sd, cpu_offload)


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
