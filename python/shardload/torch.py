"""shardload.torch: load safetensors checkpoints into torch models and DTensors, in torch's terms.

    import shardload.torch as slt
    missing, unexpected = slt.load_model(model, "/ckpt/llama")        # an FSDP2 model, every rank
    sd = slt.load_sharded("/ckpt/llama", mesh, [Shard(0)])            # {name: DTensor on mesh}

Both are collective: every rank of the process group (load_model) or of the mesh
(load_sharded) calls them with the same arguments; any failure is raised on every one of those
ranks (ShardloadError, a RuntimeError). A load into fresh local tensors (a meta model, or
entries whose storage cannot take the shard in place) that fails leaves the model as it was:
nothing is assigned until every shard has landed. A load in place into a materialised model's
own storage that fails mid-load (a read error, a rank out of memory) leaves those parameters
partly overwritten, some with checkpoint values and some with their old ones: load it again, or
rebuild the model, before using it. Argument, key and shape errors are raised before any
byte is written, so they leave it as it was either way.

load_model (like safetensors.torch.load_model, for models sharded with FSDP2's fully_shard):
- the plan is read from model.state_dict(): each DTensor's mesh and placements, plain tensors
  (buffers, parameters FSDP2 does not manage) whole on every rank, each entry's dtype (a
  floating checkpoint tensor other than float8_e4m3fn is cast to it, as Accelerate does; an
  integer/bool one too, as load_state_dict's copy does, refused where a value does not fit;
  float8_e4m3fn keeps the checkpoint's dtype).
- the source: a path (.safetensors file, index.json or a directory holding one; no rank ever
  holds the full dict), or the process group's rank 0's full state dict (the other ranks'
  argument is ignored; rank 0's decides the form).
- cpu_offload: True = CPU, False = the accelerator, None = the model's FSDP2 offload policy
  (CPUOffloadPolicy: CPU, pinned when its pin_memory is set; none: the accelerator); the same
  rule for every parameter on every rank. Plain entries stay on the mesh's device, as
  fully_shard keeps buffers. A model without DTensors (plain, DDP-style) loads onto its
  tensors' own device (all on one, else an error; a meta model: the CPU).
- shards land in freshly allocated local tensors (a meta model) or in place in the
  parameters' own local storage where it has the shard's placement, dtype and shape (a
  materialised model); they are assigned as DTensors on the parameters' meshes
  (load_state_dict(assign=True)). Tied weights (saved once) stay tied: every name of the tie
  is set to the one loaded Parameter, as safetensors.torch.load_model keeps it.
- strict=True: a key missing on either side raises, worded as torch's load_state_dict;
  strict=False: returns them, loads the rest and leaves missing entries as they are. A shape
  that differs from the model's raises either way ("size mismatch for K", as torch says).
- process_group: the ranks that load (default: the default group). A subgroup works: its
  meshes must hold its ranks in order, its rank 0 reads (and passes the state dict).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Callable, Sequence, Union

try:
    import torch
except ImportError as e:  # `import shardload` works without torch; this module is torch's API
    raise ImportError(f"shardload.torch needs PyTorch ({e}); install torch, or use shardload's own API "
                      "(shardload.Context) without it") from e

import shardload
from shardload import _dlpack
from shardload import _torch as _t

__all__ = ["load_model", "load_sharded", "last_load_report"]

# this rank's account of the last load_model (the drop-in's last_load_report shares it): cleared,
# never rebound, so a module that imported it sees every load
_report: dict[str, dict] = {}



def last_load_report() -> dict[str, dict]:
    """This rank's account of the last load_model: per state-dict key, the device the shard is on
    (torch's name: "cpu", "cuda:1"), where the contract placed it ("placed": "cpu" or "device"), the placement rule that chose it, pinned, loaded in place into the
    parameter's own storage or not, and the backend/collective used."""
    return dict(_report)


# ---- arguments ---------------------------------------------------------------------------

def _check_progress(progress) -> None:
    # checked before anything collective: every rank passes the same kind of argument
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable (done_bytes, total_bytes, done_tensors, total_tensors) "
                        f"or None, not {type(progress).__name__}")


def _check_tri(cpu_offload) -> None:
    if cpu_offload is not None and not isinstance(cpu_offload, bool):
        raise TypeError(f"cpu_offload must be True, False or None (the offload policy decides), not {cpu_offload!r}")


class _Group:
    """The ranks that load: the torch group (None: the default one), its global ranks in group
    order, this rank's index in it, and whether it is a proper subgroup of the world."""

    def __init__(self, pg, ranks: list[int], rank: int, sub: bool):
        self.pg, self.ranks, self.rank, self.sub = pg, ranks, rank, sub

    @property
    def size(self) -> int:
        return len(self.ranks)


def _group(process_group) -> _Group:
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        if process_group is not None:
            raise ValueError("process_group: torch.distributed is not initialised; call "
                             "dist.init_process_group first, or pass process_group=None for one process")
        return _Group(None, [0], 0, False)
    world = dist.get_world_size()
    if process_group is None or process_group is dist.group.WORLD:
        return _Group(None, list(range(world)), dist.get_rank(), False)
    if process_group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group gives the ranks outside it
        raise ValueError(f"process_group: rank {dist.get_rank()} is not one of its ranks (new_group returned "
                         "NON_GROUP_MEMBER here); call it only on the group's ranks")
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group must be a torch.distributed ProcessGroup or None, not "
                        f"{type(process_group).__name__}")
    ranks = dist.get_process_group_ranks(process_group)
    if dist.get_rank() not in ranks:
        raise ValueError(f"process_group: rank {dist.get_rank()} is not one of its ranks {ranks}; call it only "
                         "on the group's ranks")
    return _Group(process_group, ranks, ranks.index(dist.get_rank()), ranks != list(range(world)))


def _gather(g: _Group, obj) -> list:
    """OBJ of every rank of the group, in group order."""
    import torch.distributed as dist
    if g.size == 1:
        return [obj]
    out = [None] * g.size
    dist.all_gather_object(out, obj, group=g.pg)
    return out


# ---- context -----------------------------------------------------------------------------

def _store_rendezvous(g: _Group, name: str) -> tuple[str, str | None]:
    """The default group's store as a rendezvous for a subgroup's context (the same store
    torch's ranks share, never a port of shardload's own), and a directory to remove after."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    store = c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if isinstance(store, dist.TCPStore):
        host = store.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"c10d://{host}:{store.port}", None
    if isinstance(store, dist.FileStore) and getattr(store, "path", None):
        d = os.path.join(store.path + ".shardload.d", name)
        os.makedirs(d, mode=0o700, exist_ok=True)
        return f"file://{d}", d if g.rank == 0 else None
    raise ValueError(f"process_group: the default group's store is a {type(store).__name__}, which shardload "
                     "cannot join for a subgroup; use a TCPStore (torchrun, env://, tcp://) or a FileStore")


class _SubgroupContext(shardload.Context):
    """A context over a subgroup's ranks, met through the default group's store."""

    _cleanup: str | None = None

    def close(self) -> None:
        super().close()
        d, self._cleanup = self._cleanup, None
        if d:
            import shutil
            shutil.rmtree(d, ignore_errors=True)


def _context(g: _Group, dev: torch.device) -> shardload.Context:
    """A shardload context over the group's ranks on DEV (collective over the group)."""
    backend = "cpu" if dev.type == "cpu" else "auto"
    index = dev.index if dev.type != "cpu" else None
    n = g.size
    if not g.sub:
        return shardload.Context(backend, device=index)
    # the members agree on a name and on how many contexts of this size they made: ranks that
    # differ would wait for each other under different rendezvous keys until the timeout
    # every context of world size n this process made counts (shardload.Context counts them:
    # a direct Context(process_group=...) numbers as much as one of this module's)
    everyone = _gather(g, (shardload._contexts_made[n], uuid.uuid4().hex))
    counts = [c for c, _ in everyone]
    if len(set(counts)) != 1:
        raise ValueError(f"process_group {g.ranks}: its ranks have made {counts} shardload contexts of world "
                         f"size {n} in this process; libshardload numbers a process's contexts per world size, "
                         f"so a subgroup's ranks must have loaded through the same groups of {n} alike (use one "
                         "subgroup per rank set, or the default group)")
    name = f"sub-{'-'.join(map(str, g.ranks))}-{counts[0]}-{everyone[0][1]}"
    rendezvous, cleanup = _store_rendezvous(g, name)
    ctx = _SubgroupContext(backend, world_size=n, rank=g.rank, rendezvous=rendezvous, device=index,
                           job_key=f"torch-subgroup:{name}", use_process_group=False)
    ctx._cleanup = cleanup
    return ctx


def _local_device(dev_type: str, device=None) -> torch.device:
    """The device this rank's shards of DEV_TYPE go to: DEVICE where it names one of that type
    with an index, else the one torch allocates on ("cuda" alone means the current one)."""
    if dev_type == "cpu":
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == dev_type and device.index is not None:
        return device
    mod = getattr(torch, dev_type, None)
    idx = mod.current_device() if mod is not None and hasattr(mod, "current_device") else 0
    return torch.device(dev_type, idx)


def _alloc(want: torch.device, info) -> torch.Tensor:
    cpu = want.type == "cpu"
    return torch.empty(info.local_shape, dtype=_t.torch_dtype(info.dtype), device=want,
                       pin_memory=bool(cpu and info.pinned and torch.cuda.is_available()))


def _want_device(info, dev: torch.device) -> torch.device:
    return torch.device("cpu") if info.dlpack_device[0] in _dlpack.HOST_KINDS else dev


# integer and bool dtypes: a cast from one is exact or refused, never a wrap-around
_EXACT = {"I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL"}


def _finish(local: torch.Tensor, info, dev: torch.device, host_backend: bool, dt_target: str) -> torch.Tensor:
    """A loaded local shard as torch wants it: on DEV where the library staged it in host
    memory (no device backend), in the target dtype where the library does not cast. An
    integer/bool shard whose values the target cannot hold is refused, naming the tensor."""
    if info.device == "device" and host_backend and dev.type != "cpu":
        local = local.to(dev)
    if _t.torch_dtype(info.dtype) != _t.torch_dtype(dt_target):
        cast = local.to(_t.torch_dtype(dt_target))
        if info.dtype in _EXACT and not torch.equal(cast.to(local.dtype), local):
            raise ValueError(f"'{info.name}': its checkpoint values ({info.dtype}) do not fit the model's dtype "
                             f"{_t.torch_dtype(dt_target)}; give the model the checkpoint's dtype, or save "
                             "values that fit")
        local = cast
    return local


def _load_dtype(file_dtype: str, target: str) -> str:
    """What the library loads as: the target where it casts both (F64/F32/F16/BF16), else the
    file's dtype (torch casts after the load)."""
    return target if file_dtype in _t.CASTABLE and target in _t.CASTABLE else file_dtype


# ---- load_model: the plan from model.state_dict() -----------------------------------------

def _fsdp2() -> tuple[type, type]:
    """torch's (FSDPModule, CPUOffloadPolicy): exported from torch.distributed.fsdp since 2.6,
    from torch.distributed._composable.fsdp in 2.4 and 2.5. Neither: an error, never "no
    policy" (a CPU-offloaded model would load onto the accelerator)."""
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
        return FSDPModule, CPUOffloadPolicy
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import CPUOffloadPolicy, FSDPModule
        return FSDPModule, CPUOffloadPolicy
    except ImportError as e:
        raise ImportError(f"shardload.torch: this torch ({torch.__version__}) has no FSDP2 (FSDPModule, "
                          f"CPUOffloadPolicy: {e}); shardload.torch needs torch >= 2.4") from e


def _fsdp_policies(model) -> dict[int, object]:
    """id(parameter) -> the offload policy of the FSDP2 group that manages it."""
    out = {}
    FSDPModule, _ = _fsdp2()
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
    if policy is None or not isinstance(policy, _fsdp2()[1]):  # a subclass offloads too
        return "none"
    return "cpu-pinned" if getattr(policy, "pin_memory", True) else "cpu"


def _plan_policy(key: str):
    """The plan's offload policy for a policy key: torch's own object, which every version of
    the package's plan takes (its string spellings changed: "cpu+pin", then "cpu-pinned")."""
    if key in ("none", "plain"):
        return None
    return _fsdp2()[1](pin_memory=key == "cpu-pinned")


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


def _mesh_ranks_text(ranks: list[int]) -> str:
    return f"{ranks[:8]}{'...' if len(ranks) > 8 else ''}"


class _MeshNotGroup(ValueError):
    """A model on a mesh over other ranks than the group's: raised at once, never agreed, since
    the group's other ranks are then likely not calling at all (a subgroup's model loaded
    without its process_group)."""


def _plan_entries(model, g: _Group):
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
            if ranks != g.ranks:
                whose = (f"all {g.size} ranks in order" if not g.sub else
                         f"the process group's ranks {_mesh_ranks_text(g.ranks)} in order")
                raise _MeshNotGroup(f"'{key}': its device mesh holds ranks {_mesh_ranks_text(ranks)}; shardload loads "
                                 f"onto meshes over {whose} (pass the mesh's group as process_group)")
            e.mesh, e.placements = mesh, v.placements
            e.spec = _placement_spec(key, v.placements)
        else:
            e.spec = "replicate"
        entries.append(e)
    return entries


def _model_device(entries) -> tuple[str, torch.device | None]:
    """(device type, device or None) the model loads onto: its meshes' device type; for a model
    without DTensors (plain, DDP-style) its tensors' own device, so that a model on cuda:1
    stays there (a meta or empty one: the CPU)."""
    kinds = {e.mesh.device_type for e in entries if e.mesh is not None}
    if len(kinds) > 1:
        raise ValueError(f"the model's meshes are on several device types {sorted(kinds)}")
    if kinds:
        return kinds.pop(), None
    devices = {e.value.device for e in entries if e.value.device.type != "meta"}
    if len(devices) > 1:
        raise ValueError(f"the model's tensors are on several devices {sorted(map(str, devices))}; load_model "
                         "loads a model without DTensors onto its one device: move it to one (model.to(device)) first")
    if not devices:
        return "cpu", None
    d = devices.pop()
    return d.type, d


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


def _same_plan_everywhere(g: _Group, path, extra, entries):
    """One exchange over the torch group: rank 0's source form (it decides for every rank) and
    the keys of its state dict the model lacks, and the model.state_dict() each rank plans
    from. Ranks whose models differ would make different loads and wait for each other; they
    fail together instead, every rank naming the first rank that differs from rank 0 and the
    first entry where it does. Returns (path, extra, error)."""
    sig = _signature(entries) if entries is not None else None
    digest = hashlib.sha256(repr(sig).encode()).hexdigest() if sig is not None else None
    everyone = _gather(g, (path, extra, digest))
    path, extra = everyone[0][0], everyone[0][1]
    bad = next((r for r in range(1, g.size) if everyone[r][2] not in (everyone[0][2], None)
                and everyone[0][2] is not None), None)
    if bad is None:
        return path, extra, None
    sigs = _gather(g, sig)  # the whole signatures, only when they differ
    a, b = sigs[0], sigs[bad]
    i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    where = (f"entry {i}: rank 0 has {a[i] if i < len(a) else 'nothing'}, rank {bad} has "
             f"{b[i] if i < len(b) else 'nothing'}")
    return path, extra, shardload.ShardloadError(shardload.Status.ERR_MISMATCH, f"rank {bad}'s model.state_dict() differs from rank 0's "
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


def _key_errors(model, where: str, missing: list[str], unexpected: list[str]) -> RuntimeError:
    """torch's load_state_dict wording, with where the keys were looked for."""
    msgs = []
    if missing:
        msgs.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
    if unexpected:
        msgs.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
    return RuntimeError(f"Error(s) in loading state_dict for {type(model).__name__} from {where}:\n\t"
                        + "\n\t".join(msgs) + "\n\tPass strict=False to load the others and get these keys back")


def _missing_error(path, missing: list[str]) -> KeyError:
    """The drop-in's wording: Accelerate loads every entry of the model or fails."""
    return KeyError(f"{len(missing)} model.state_dict() entries are not in "
                    f"{'the checkpoint ' + path if path is not None else 'full_sd'}: "
                    f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")


def _resolve_sources(entries, src, model, path, unexpected, strict, accelerate):
    """Each entry's checkpoint name, the missing keys, the shape check and the dtypes; raises
    what strictness refuses. Returns the missing keys."""
    for e in entries:
        e.src_key = e.key if e.key in src else next((a for a in e.aliases if a in src), None)
    missing = [e.key for e in entries if e.src_key is None]
    if accelerate:
        if missing:
            raise _missing_error(path, missing)
    elif strict and (missing or unexpected):
        where = f"the checkpoint {path}" if path is not None else "rank 0's state dict"
        raise _key_errors(model, where, missing, unexpected)
    present = [e for e in entries if e.src_key is not None]
    _check_shapes(present, src, path)
    for e in present:
        # the checkpoint's dtypes decide the casts, as on Accelerate's rank 0
        fdt = src[e.src_key].dtype
        want = _t.dtype_name(e.value.dtype)
        floating = fdt in ("F64", "F32", "F16", "BF16", "F8_E5M2")
        # integer/bool entries take the model's dtype, as load_state_dict's copy does (an I32
        # buffer stays int32), where every value survives the cast (_finish checks)
        e.dt_target = want if floating or fdt in _EXACT else fdt
        e.dt_load = _load_dtype(fdt, e.dt_target)
    return missing


def _load_groups(ctx, src, entries, dev, cpu_offload, results, progress=None):
    """One sl_load per (mesh shape, offload policy) of the entries that load under their own
    name; RESULTS[key] = the local shard."""
    host_backend = ctx.backend == "cpu"
    groups = defaultdict(list)
    for e in entries:
        if e.src_key == e.key:  # the others take their alias's shard; missing ones nothing
            shape = tuple(e.mesh.mesh.shape) if e.mesh is not None else None
            # plain entries (buffers, parameters FSDP2 ignores) are not offloaded by FSDP2:
            # fully_shard keeps them on the mesh's device, and so does this
            groups[(shape, "plain" if e.mesh is None else e.policy)].append(e)
    for (shape, policy), group in groups.items():
        plain = policy == "plain"
        plan = ctx.plan(mesh=list(shape) if shape else [ctx.world_size], offload_policy=_plan_policy(policy))
        for e in group:
            plan.add_entry(e.key, e.spec, e.dt_load)
        by_key = {e.key: e for e in group}

        def bind(t, by_key=by_key):
            e = by_key[t.name]
            want = _want_device(t, dev)
            local = e.value.to_local() if hasattr(e.value, "to_local") else e.value
            reuse = _reusable(e, want, t.pinned) if tuple(local.shape) == t.local_shape else None
            if reuse is not None:
                e.local = reuse
                return reuse
            e.local = e.fresh = _alloc(want, t)
            return e.local

        state = ctx.load(plan, src, cpu_offload=False if plain else cpu_offload, bind=bind, progress=progress)
        err = None
        try:
            if dev.type == "cuda":
                # sl_load returns with its streams drained; this also orders torch's
                # streams after every write to the tensors torch allocated
                torch.cuda.synchronize(dev)
            for e in group:
                t = state[e.key]
                _report[e.key] = {"placed": t.device, "rule": t.rule, "pinned": t.pinned,
                                  "in_place": e.local is not None and e.local is not e.fresh,
                                  "backend": ctx.backend, "collective": ctx.collective}
                if plain:
                    _report[e.key]["note"] = "not an FSDP2 parameter: on the mesh's device, as fully_shard keeps it"
                results[e.key] = _finish(e.local, t, dev, host_backend, e.dt_target)
                _report[e.key]["device"] = str(results[e.key].device)  # where it is, e.g. "cuda:1"
                e.local = e.fresh = None
        except Exception as ex:  # e.g. out of memory on one rank: every rank stops here
            err = ex
        state.close()
        del state
        plan.close()
        ctx.agree(err if err is not None else True)


def _assign(model, entries, results, partial: bool):
    """The loaded shards as the model's parameters and buffers: DTensors on their meshes."""
    from torch.distributed.tensor import DTensor
    sharded_sd = {}
    ties = []  # (alias name, the name assigned for it): one tensor under several names
    assigned = {}  # the tensor's first name -> the name assigned for the whole tie
    for e in entries:
        if e.src_key is None:
            continue
        if e.key not in results:
            _report[e.key] = dict(_report[e.src_key], alias_of=e.src_key)
        first = next((a for a in (e.key,) + e.aliases if a in assigned), None)
        if first is not None:
            # assign=True would give each name its own Parameter and untie the model; the
            # alias takes its source's Parameter object after the load, as the tie had it
            ties.append((e.key, assigned[first]))
            continue
        assigned[e.key] = e.key
        local = results[e.key] if e.key in results else results[e.src_key]
        if e.mesh is not None:
            sharded_sd[e.key] = DTensor.from_local(local, e.mesh, e.placements, run_check=False,
                                                   shape=e.value.shape, stride=e.value.stride())
        else:
            sharded_sd[e.key] = local
    results.clear()
    # FSDP2 re-pads uneven shards and pins under a pinned policy here (reset_sharded_param).
    # The aliases are absent from sharded_sd on purpose: not missing keys
    alias_names = {a for a, _ in ties}
    res = model.load_state_dict(sharded_sd, assign=True, strict=False)
    if not partial:
        left = [k for k in res.missing_keys if k not in alias_names]
        if left or res.unexpected_keys:
            raise _key_errors(model, "the loaded shards", left, list(res.unexpected_keys))
    for alias, source in ties:
        _retie(model, alias, source)


def _retie(model, alias: str, source: str) -> None:
    """ALIAS (a state-dict name) set to SOURCE's very tensor object, as the model tied them."""
    def owner(name):
        mod_path, _, leaf = name.rpartition(".")
        return (model.get_submodule(mod_path) if mod_path else model), leaf
    src_mod, src_leaf = owner(source)
    t = getattr(src_mod, src_leaf)
    mod, leaf = owner(alias)
    if leaf in mod._parameters:
        mod._parameters[leaf] = t
    elif leaf in mod._buffers:
        mod._buffers[leaf] = t
    else:
        setattr(mod, leaf, t)


def _pick(source: Mapping, wanted: set) -> tuple[dict, list]:
    """(the entries of SOURCE the model names, the keys of the others): only what the model
    names is loaded; the others are reported (never loaded, whatever their dtype)."""
    picked, extra = {}, []
    for k, v in source.items():
        if k in wanted:
            picked[k] = v
        else:
            extra.append(k)
    return picked, extra


def _open_model_source(ctx, source, path, picked):
    if path is not None:
        return ctx.open(path)
    sd = None
    if ctx.rank == 0:
        # not a mapping: open_state_dict names the problem on every rank
        sd = picked if isinstance(source, Mapping) else source
    return ctx.open_state_dict(sd, label="full_sd (rank 0's state dict)")


def _load_model(model, source, *, cpu_offload=None, process_group=None, strict=True, device=None,
                accelerate=False, progress=None) -> tuple[list[str], list[str]]:
    """load_model, and the drop-in's load (ACCELERATE: a missing key fails in its wording,
    unexpected ones are ignored; DEVICE: the accelerator's device)."""
    _check_tri(cpu_offload)
    g = _group(process_group)
    # rank 0's source decides the form (the other ranks' argument is ignored): a path, or its dict
    path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    dev_type, own = "cpu", None
    err, wanted, extra, picked = None, set(), None, None
    try:
        entries = _plan_entries(model, g)
        dev_type, own = _model_device(entries)
        wanted = {e.key for e in entries} | {a for e in entries for a in e.aliases}
        if path is None and g.rank == 0 and isinstance(source, Mapping):
            # rank 0's dict read once, here: a Mapping that fails to iterate fails every rank
            # (agreed below), never rank 0 alone while the others wait in the exchange
            picked, extra = _pick(source, wanted)
    except _MeshNotGroup:
        raise
    except Exception as e:  # agreed below, once a context exists
        err, entries = e, []
    if g.size > 1:
        path, extra, mismatch = _same_plan_everywhere(g, path, extra, entries if err is None else None)
        err = err or mismatch
    dev = _local_device(dev_type, device if device is not None else own)
    _report.clear()
    results: dict[str, Any] = {}
    with _context(g, dev) as ctx:
        ctx.agree(err if err is not None else True)
        with _open_model_source(ctx, source, path, picked) as src:
            err, missing, unexpected = None, [], []
            try:
                unexpected = ([t.name for t in src if t.name not in wanted] if path is not None
                              else [str(k) for k in extra or ()])
                missing = _resolve_sources(entries, src, model, path, unexpected, strict, accelerate)
            except Exception as ex:
                err = ex
            ctx.agree(err if err is not None else True)
            _load_groups(ctx, src, entries, dev, cpu_offload, results, progress)
        err = None
        try:
            _assign(model, entries, results, partial=bool(missing))
        except Exception as ex:
            err = ex
        ctx.agree(err if err is not None else True)
    return missing, unexpected


def load_model(model: torch.nn.Module, path_or_state_dict, *, cpu_offload: bool | None = None,
               process_group=None, strict: bool = True,
               progress: Callable[..., None] | None = None) -> tuple[list[str], list[str]]:
    """Loads a checkpoint into MODEL, an nn.Module whose parameters are FSDP2 DTensors (or plain
    tensors: whole on every rank), on every rank of PROCESS_GROUP (collective).

    path_or_state_dict: a .safetensors file, an index.json or a directory holding one, or the
    group's rank 0's full state dict (the other ranks pass None or anything).
    cpu_offload: True = CPU, False = the accelerator, None = the model's FSDP2 offload policy.
    progress(done_bytes, total_bytes, done_tensors, total_tensors): called on the group's rank 0
    as tensors land (Context.load's progress; a two-parameter one gets the bytes); a model whose
    entries load in several groups (mesh shape, offload policy, plain entries) reports each
    group's load in turn, its totals that group's.
    Returns (missing, unexpected): the model's keys the checkpoint lacks, the checkpoint's keys
    the model lacks; strict=True raises on either (RuntimeError, torch's wording, every rank)."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, not {strict!r}")
    _check_progress(progress)
    return _load_model(model, path_or_state_dict, cpu_offload=cpu_offload, process_group=process_group,
                       strict=strict, progress=progress)


# ---- load_sharded ------------------------------------------------------------------------

Placements = Union[Sequence[Any], Callable[[str], Sequence[Any]]]


def _mesh_group(mesh) -> _Group:
    """The group of MESH's ranks: the default group where it spans the world in order, the
    mesh's own group where it is a 1-D mesh over fewer ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a torch DeviceMesh (init_device_mesh), not {type(mesh).__name__}")
    ranks = mesh.mesh.flatten().tolist()
    g = _group(None)
    if ranks == g.ranks:
        return g
    if mesh.ndim == 1 and dist.get_rank() in ranks:
        return _group(mesh.get_group())
    raise ValueError(f"mesh: it holds ranks {_mesh_ranks_text(ranks)}; shardload loads onto a mesh over all "
                     f"{g.size} ranks in row-major order, or a 1-D mesh over some of them (from its ranks)")


def _sharded_device(mesh, device) -> torch.device:
    if device is None:
        return _local_device(mesh.device_type)
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device or None (the mesh's device type), not {type(device).__name__}")
    if device.type != mesh.device_type:
        raise ValueError(f"device {device}: the mesh is on {mesh.device_type}; give a {mesh.device_type} device "
                         "or None")
    return _local_device(device.type, device)


def _spec_of(name: str, ndim: int, placements, mesh_ndim: int) -> tuple[str, tuple]:
    """('[shard(1), replicate]', the normalised torch placements) of one tensor."""
    from torch.distributed.tensor import Replicate, Shard
    ps = placements(name) if callable(placements) else placements
    if not isinstance(ps, (list, tuple)) or len(ps) != mesh_ndim:
        raise ValueError(f"'{name}': placements {ps!r} must be a list of {mesh_ndim} torch placements (Shard(d), "
                         "Replicate()), one per mesh dim")
    out = []
    for p in ps:
        if isinstance(p, Shard) and type(p) is Shard:
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                need = p.dim + 1 if p.dim >= 0 else -p.dim
                raise ValueError(f"'{name}': Shard({p.dim}) needs a tensor of at least {need} dims; it has {ndim} "
                                 "(give it Replicate(), e.g. through a callable placements)")
            out.append(Shard(d))
        elif isinstance(p, Replicate):
            out.append(Replicate())
        else:
            raise ValueError(f"'{name}': placement {p!r} is not Shard(d) or Replicate()")
    return _placement_spec(name, out), tuple(out)


def _sharded_entries(src, placements, dtype, mesh_ndim: int) -> list[tuple]:
    """(name, spec, torch placements, load dtype, target dtype) of every checkpoint tensor."""
    target = _t.dtype_name(dtype) if dtype is not None else None
    out = []
    for t in src:
        spec, ps = _spec_of(t.name, len(t.shape), placements, mesh_ndim)
        want = target if target is not None and t.dtype in ("F64", "F32", "F16", "BF16", "F8_E5M2", "F8_E4M3") else t.dtype
        if want not in _t.SL_TO_TORCH or t.dtype not in _t.SL_TO_TORCH:
            raise ValueError(f"'{t.name}': dtype {t.dtype} has no torch equivalent here")
        out.append((t.name, spec, ps, _load_dtype(t.dtype, want), want))
    return out


def load_sharded(path, mesh, placements: Placements, *, dtype: torch.dtype | None = None,
                 device: torch.device | None = None, cpu_offload: bool | None = None,
                 progress: Callable[..., None] | None = None) -> dict[str, Any]:
    """Every tensor of the checkpoint at PATH (a .safetensors file, an index.json or a directory
    holding one) as a DTensor on MESH (a torch DeviceMesh) with PLACEMENTS: one list of torch
    placements (Shard(d), Replicate(); one per mesh dim) for every tensor, or a function of the
    tensor's name returning one. Collective over the mesh's ranks; bit-identical to
    distribute_tensor(full, mesh, placements).

    dtype: floating tensors are cast to it (torch's rounding); others keep their dtype; None:
    as stored. device: where the local shards go (a torch.device of the mesh's type; None: the
    current one). cpu_offload: True = host memory, False/None = the device (no offload policy).
    progress: as Context.load's, called on the mesh's rank 0 as tensors land."""
    from torch.distributed.tensor import DTensor
    _check_tri(cpu_offload)
    _check_progress(progress)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a checkpoint path (a .safetensors file, an index.json or a directory), "
                        f"not {type(path).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype (floating tensors are cast to it) or None, not {dtype!r}")
    if not (callable(placements) or isinstance(placements, (list, tuple))):
        raise TypeError(f"placements must be a list of torch placements or a function of the name, not "
                        f"{type(placements).__name__}")
    g = _mesh_group(mesh)
    dev = _sharded_device(mesh, device)
    out: dict[str, Any] = {}
    with _context(g, dev) as ctx, ctx.open(path) as src:
        err, entries = None, []
        try:
            entries = _sharded_entries(src, placements, dtype, mesh.ndim)
            digest = hashlib.sha256(repr([e[:2] + e[3:] for e in entries]).encode()).hexdigest()
        except Exception as ex:
            err, digest = ex, None
        # a placements function that answers differently on two ranks would make two plans
        digests = _gather(g, digest)
        if err is None and any(d is not None and d != digests[0] for d in digests):
            bad = next(r for r, d in enumerate(digests) if d is not None and d != digests[0])
            err = ValueError(f"placements: rank {bad} of the mesh gives other placements or dtypes than rank 0; "
                             "every rank must ask for the same")
        ctx.agree(err if err is not None else True)
        plan = ctx.plan(mesh=list(mesh.mesh.shape))
        for name, spec, _, dt_load, _ in entries:
            plan.add_entry(name, spec, dt_load)
        locals_: dict[str, torch.Tensor] = {}

        def bind(t):
            locals_[t.name] = _alloc(_want_device(t, dev), t)
            return locals_[t.name]

        state = ctx.load(plan, src, cpu_offload=cpu_offload, bind=bind, progress=progress)
        err = None
        try:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            host_backend = ctx.backend == "cpu"
            for name, _, ps, _, want in entries:
                t = state[name]
                local = _finish(locals_.pop(name), t, dev, host_backend, want)
                shape = torch.Size(t.global_shape)
                out[name] = DTensor.from_local(local, mesh, ps, run_check=False, shape=shape,
                                               stride=torch.empty(shape, device="meta").stride())
        except Exception as ex:
            err = ex
        state.close()
        plan.close()
        ctx.agree(err if err is not None else True)
    return out

