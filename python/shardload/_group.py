"""Who the ranks are and which device: a torch ProcessGroup's ranks and store as the context's
rendezvous, the launcher's LOCAL_RANK, and a device argument in torch's spelling ("cuda:1", a
torch.device) as the backend that drives it and its ordinal."""

from __future__ import annotations

import itertools
import os
import sys
from typing import Iterator

from . import _capi


def env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"${name}={v!r} is not an integer; unset it or give the process's index") from None


# per process group (by its name, the same on every member), counted only in
# process_group_rendezvous: every member numbers its contexts of that group alike (a world-1
# context one rank makes on the side, or one of another group, does not shift the others' keys)
_serials: dict[str, Iterator[int]] = {}


def torch_group(process_group):
    """(torch.distributed, the group) for PROCESS_GROUP (None: the default group), or None when
    none is given and no default group is initialised."""
    if process_group is None and "torch" not in sys.modules:
        return None
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        if process_group is not None:
            raise ValueError("Context: process_group given, but torch.distributed is not initialised in this "
                             "process: call torch.distributed.init_process_group first")
        return None
    from torch.distributed import distributed_c10d as c10d
    group = c10d._get_default_group() if process_group is None else process_group
    if dist.get_rank(group) < 0:
        raise ValueError("Context: process_group: this process is not a member of the group; only its members "
                         "create the Context")
    return dist, group


def process_group_rendezvous(process_group=None):
    """(world, rank, local_rank, rendezvous, key) of PROCESS_GROUP (a torch ProcessGroup; None:
    the default group when one is initialised), or None. The group's own store is reused (never
    a second server on another port): a c10d TCPStore (env://, tcp://, torchrun's agent store)
    as c10d://HOST:PORT, a FileStore as a file:// directory beside its file, one per context
    (the group's rank 0 names it through the store: a file:// rendezvous never overwrites an
    earlier job's keys). KEY names the group and the context's place among the group's
    contexts, so that two groups over one store never meet."""
    found = torch_group(process_group)
    if found is None:
        return None
    dist, group = found
    from torch.distributed import distributed_c10d as c10d
    try:
        gstore = c10d._get_process_group_store(group)
    except KeyError:
        raise ValueError(f"Context: process_group {group!r} is not a process group of this job's "
                         "torch.distributed world") from None
    default = group is c10d._get_default_group()
    name = "" if default else c10d._get_process_group_name(group)
    serial = next(_serials.setdefault(name, itertools.count()))
    key = f"torch-pg:{serial}" if default else f"torch-pg:{name}:{serial}"
    store = gstore
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    local_rank = env_int("LOCAL_RANK", dist.get_rank())
    if isinstance(store, dist.TCPStore):
        host = store.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return world, rank, local_rank, f"c10d://{host}:{store.port}", key
    if isinstance(store, dist.FileStore) and getattr(store, "path", None):
        import uuid
        skey = f"shardload/rendezvous/{serial}"  # under the group's prefix in its store
        if rank == 0:
            gstore.set(skey, uuid.uuid4().hex)
        d = os.path.join(store.path + ".shardload.d", gstore.get(skey).decode())
        os.makedirs(d, mode=0o700, exist_ok=True)
        return world, rank, local_rank, f"file://{d}", key
    from . import ShardloadError
    raise ShardloadError(_capi.status_enum().ERR_INVALID,
                         f"the torch.distributed group's store is a {type(store).__name__}, which shardload "
                         "cannot join: pass rendezvous='tcp://HOST:PORT' or 'file://DIR' to Context")


def device_arg(device, backend: str | None) -> tuple[int | None, str | None]:
    """Context's DEVICE (an ordinal, a torch.device, "cuda:1", "cpu") as (ordinal or None, backend
    or None): a device type names the backend that drives it, which a given BACKEND must match."""
    if device is None or isinstance(device, int) and not isinstance(device, bool):
        return device, backend
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if index and not index.isdigit():
            raise ValueError(f"Context: device {device!r}: give an ordinal, 'TYPE' or 'TYPE:N' (e.g. 'cuda:1', "
                             "'cpu') or a torch.device")
        ordinal = int(index) if index else None
    elif type(device).__name__ == "device" and hasattr(device, "type"):  # torch.device
        kind, ordinal = device.type, device.index
    else:
        raise TypeError(f"Context: device must be an int, a str such as 'cuda:1' or a torch.device, not "
                        f"{type(device).__name__} ({device!r})")
    want = device_backend(kind)
    if want is None:
        raise ValueError(f"Context: device {device!r}: shardload drives cpu, cuda (hip under a ROCm torch), "
                         "xpu (level_zero) and sim devices")
    if backend not in (None, "auto") and backend.split(":")[0] != want:
        raise ValueError(f"Context: device {device!r} is driven by backend {want!r}, not the {backend!r} given; "
                         "pass one of them, or both alike")
    return (None if kind == "cpu" else ordinal), (backend if backend not in (None, "auto") else want)


def device_backend(kind: str) -> str | None:
    if kind == "cuda":
        torch = sys.modules.get("torch")
        return "hip" if torch is not None and getattr(torch.version, "hip", None) else "cuda"
    return {"cpu": "cpu", "hip": "hip", "xpu": "level_zero", "sim": "sim"}.get(kind)
