"""torch glue: dtype names, rank 0 state dicts as memory sources, caller buffers, DLPack import.
Imported only when torch is needed."""

from __future__ import annotations

import ctypes
from ctypes import sizeof

import torch

from . import _calls, _capi
from ._convert import cstr
from ._dlpack import HOST_KINDS, STREAM_KINDS, DLDeviceType

TORCH_TO_SL = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _n, _s in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"),
               ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _n):
        TORCH_TO_SL[getattr(torch, _n)] = _s
SL_TO_TORCH = {v: k for k, v in TORCH_TO_SL.items()}
# dtypes shardload casts between on the host and on devices (sl_dtype_is_castable)
CASTABLE = {"F64", "F32", "F16", "BF16"}


def dtype_name(dt) -> str:
    """shardload's name of a torch dtype, or a name given as a string (passed through)."""
    if isinstance(dt, str):
        return dt
    if dt in TORCH_TO_SL:
        return TORCH_TO_SL[dt]
    raise ValueError(f"dtype {dt} has no safetensors/shardload equivalent")


def torch_dtype(name: str):
    return SL_TO_TORCH[name]


def memory_table(state_dict, reads: "_calls.TrapRef"):
    """Rank 0's state dict as sl_memory_tensor entries. Host C-contiguous tensors are read where
    they are; others (on a device, strided, DTensors) are made host-contiguous one at a time by
    the read callback, so no second copy of the whole dict ever exists. The read callback
    records what it raised in reads.trap (the running load's) and fails the read."""
    if state_dict is None:
        raise ValueError("rank 0 must pass the state dict (the other ranks may pass None)")
    table, keep, lazy = [], [], {}
    for i, (name, t) in enumerate(state_dict.items()):
        if not isinstance(name, str):
            raise TypeError(f"state dict key {name!r} is a {type(name).__name__}, not a str")
        key = cstr(name, "state dict key")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state dict entry '{name}' is a {type(t).__name__}, not a tensor")
        if hasattr(t, "to_local") and hasattr(t, "device_mesh"):
            t = t.to_local()  # as Accelerate does: rank 0's local part (whole when replicated)
        t = t.detach()
        if t.is_meta:
            raise ValueError(f"state dict entry '{name}' is on the meta device: rank 0's state dict must "
                             "hold the weights (load them first, or pass a checkpoint path instead)")
        if t.dim() > _capi.SL_MAX_DIMS:
            raise ValueError(f"state dict entry '{name}' has {t.dim()} dims; shardload takes at most "
                             f"{_capi.SL_MAX_DIMS}")
        m = _capi.MemoryTensor()
        m.size = sizeof(m)
        m.name = key
        try:
            m.dtype = _capi.DTYPE_CODES[dtype_name(t.dtype)]
        except ValueError as e:
            raise ValueError(f"state dict entry '{name}': {e}") from None
        m.ndim = t.dim()
        for d, s in enumerate(t.shape):
            m.shape[d] = int(s)
        if t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0:
            m.data = t.data_ptr()
        else:
            m.data = None
            lazy[i] = (name, t)
        keep.append((m.name, t))
        table.append(m)

    cache: dict[int, torch.Tensor] = {}

    def read(user, index, offset, dst, nbytes, msg, msg_len):
        trap = reads.trap
        try:
            if trap is not None and trap.cancelled:
                raise KeyboardInterrupt("the load was interrupted")
            host = cache.get(index)
            if host is None:
                # at most two converted tensors at a time, never the whole dict; reads come in
                # file order, so a tensor read in pieces is converted again only where two
                # other converted tensors were read between its pieces
                if len(cache) >= 2:
                    del cache[next(iter(cache))]
                name, t = lazy[index]
                host = t.contiguous().cpu().reshape(-1).view(torch.uint8)
                cache[index] = host
            ctypes.memmove(dst, host.data_ptr() + offset, nbytes)
            return 0
        except BaseException as e:  # reported on every rank, naming the tensor; raised after the load
            if trap is not None:
                trap.catch(e, "read")
            if msg_len:
                b = _calls.describe(e, msg_len - 1)
                ctypes.memmove(msg, b + b"\0", len(b) + 1)
            return 3  # SL_ERR_IO

    return table, read, keep


def check_buffer(info, buf) -> tuple[int, bool]:
    """A bind callback's torch tensor: (pointer, pinned), or an error saying what is wrong."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"bind returned a {type(buf).__name__} for '{info.name}'; return a torch tensor or None")
    if not buf.is_contiguous():
        raise ValueError(f"the buffer for '{info.name}' is not contiguous")
    have = buf.numel() * buf.element_size()
    if have < info.nbytes:
        raise ValueError(f"the buffer for '{info.name}' holds {have} bytes; its shard needs {info.nbytes}")
    host = info.dlpack_device[0] in HOST_KINDS
    if host and buf.device.type != "cpu":
        raise ValueError(f"'{info.name}' is placed in host memory ({info.rule}) but its buffer is on {buf.device}")
    if not host and buf.device.type == "cpu":
        raise ValueError(f"'{info.name}' is placed on the accelerator ({info.rule}) but its buffer is in host memory")
    if not host and buf.device.index is not None and buf.device.index != info.dlpack_device[1]:
        raise ValueError(f"'{info.name}' is placed on device {info.dlpack_device[1]} but its buffer is on {buf.device}")
    return buf.data_ptr(), bool(buf.device.type == "cpu" and buf.is_pinned())


def view_buffer(buf: torch.Tensor, info) -> torch.Tensor:
    """The shard inside a caller's buffer, with its dtype and local shape."""
    dt = torch_dtype(info.dtype)
    if buf.dtype == dt and tuple(buf.shape) == tuple(info.local_shape):
        return buf
    flat = buf.reshape(-1).view(torch.uint8)[: info.nbytes]
    return flat.view(dt).view(info.local_shape)


def consumer_stream(dlpack_device) -> int | None:
    """torch's current stream on DLPACK_DEVICE, as DLPack numbers it (what torch.from_dlpack
    passes a producer): the stream torch's next kernels on the tensor run on. None for host memory."""
    device_type, index = dlpack_device
    if device_type not in STREAM_KINDS:
        return None
    s = torch.cuda.current_stream(index).cuda_stream
    return 1 if device_type == DLDeviceType.CUDA and s == 0 else s  # CUDA's 0 is ambiguous: the legacy stream is 1


def from_capsule(capsule, dtype_name_: str) -> torch.Tensor:
    t = torch.utils.dlpack.from_dlpack(capsule)
    if dtype_name_ in ("F8_E4M3", "F8_E5M2"):
        t = t.view(torch_dtype(dtype_name_))
    return t
