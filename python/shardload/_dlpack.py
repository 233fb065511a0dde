"""Exporting a loaded shard as a DLPack capsule (zero copy), kept alive by its owner.

The capsule holds a DLManagedTensor whose manager_ctx keys an entry of `_live` that references
the owner (the State) and the C export (sl_state_export): the state's memory is freed only after
every tensor viewing it is gone and the State object itself is unreachable. torch consumes the
capsule (renames it "used_dltensor") and calls the deleter when its tensor's storage dies; an
unconsumed capsule's destructor calls the deleter instead. The deleter releases the export
(sl_export_release), which records what the consumer queued on the stream it named in
__dlpack__(stream=...): the free of device memory waits, on the device, for that work (a torch
kernel still reading the tensor when its last view died), and the deleter never waits for it.
"""

from __future__ import annotations

import ctypes
import enum
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p


class DLDevice(Structure):
    _c_name_ = "DLDevice"  # dlpack.h (test_layout.py checks it against torch's copy)
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _c_name_ = "DLDataType"  # dlpack.h (test_layout.py checks it against torch's copy)
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _c_name_ = "DLTensor"  # dlpack.h (test_layout.py checks it against torch's copy)
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensor(Structure):
    _c_name_ = "DLManagedTensor"  # dlpack.h (test_layout.py checks it against torch's copy)


_DELETER = CFUNCTYPE(None, POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", _DELETER)]

# DLDataTypeCode
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
# shardload dtype name -> (code, bits); F8 goes out as bytes (U8) and is viewed by the caller
DL_DTYPES = {
    "F64": (_FLOAT, 64), "F32": (_FLOAT, 32), "F16": (_FLOAT, 16), "BF16": (_BFLOAT, 16),
    "I64": (_INT, 64), "I32": (_INT, 32), "I16": (_INT, 16), "I8": (_INT, 8),
    "U64": (_UINT, 64), "U32": (_UINT, 32), "U16": (_UINT, 16), "U8": (_UINT, 8),
    "BOOL": (_BOOL, 8), "F8_E4M3": (_UINT, 8), "F8_E5M2": (_UINT, 8),
}

_lock = threading.RLock()  # a GC pass may free an exported tensor while this thread holds it
_live: dict[int, tuple] = {}
_NAME = b"dltensor"

_py = ctypes.pythonapi
_py.Py_IncRef.restype = None
_py.Py_IncRef.argtypes = [ctypes.py_object]
_py.PyCapsule_New.restype = ctypes.py_object
_py.PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]
_py.PyCapsule_IsValid.restype = ctypes.c_int
_py.PyCapsule_IsValid.argtypes = [c_void_p, c_char_p]
_py.PyCapsule_GetPointer.restype = c_void_p
_py.PyCapsule_GetPointer.argtypes = [c_void_p, c_char_p]


# The callbacks bind what they use as defaults and are made immortal below: torch may call them
# during interpreter shutdown, after this module's globals were cleared.
def _release(entry):
    """Releases the entry's C export, then lets the entry (and its owner) go."""
    if entry is not None:
        export, release = entry[4], entry[5]
        release(export)


@_DELETER
def _deleter(managed, _live=_live, _lock=_lock, _addressof=ctypes.addressof, _release=_release):
    try:
        with _lock:
            entry = _live.pop(_addressof(managed.contents), None)
        _release(entry)
    except Exception:  # shutting down
        pass


_CAPSULE_DESTRUCTOR = CFUNCTYPE(None, c_void_p)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule, _py=_py, _NAME=_NAME, _live=_live, _lock=_lock, _release=_release):
    # consumed capsules were renamed by the consumer, which now owns the deleter call
    try:
        if _py.PyCapsule_IsValid(capsule, _NAME):
            ptr = _py.PyCapsule_GetPointer(capsule, _NAME)
            with _lock:
                entry = _live.pop(ptr, None)
            _release(entry)
    except Exception:  # shutting down
        pass


for _cb in (_deleter, _capsule_destructor):
    _py.Py_IncRef(ctypes.py_object(_cb))


def live_count() -> int:
    """DLPack exports not yet released (for tests)."""
    with _lock:
        return len(_live)


class DLDeviceType(enum.IntEnum):
    """DLPack's DLDeviceType (dlpack.h, never renumbered), as sl_tensor.device_type holds it.
    An int where DLPack wants one (__dlpack_device__); str() is the lower-case name ("cuda",
    "cuda_host", "rocm", "oneapi"), the spelling shardload's API uses for it."""
    CPU = 1
    CUDA = 2
    CUDA_HOST = 3
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12  # a device of no standard kind: the sim backend's simulated memory
    CUDA_MANAGED = 13
    ONEAPI = 14
    WEBGPU = 15
    HEXAGON = 16
    MAIA = 17
    TRN = 18

    def __str__(self) -> str:
        return self.name.lower()

    def __format__(self, spec: str) -> str:  # f"{t}" as str(), not the int
        return format(str(self), spec)

    @classmethod
    def of(cls, code: int) -> "DLDeviceType | int":
        """CODE as a member; a code newer than this table stays an int."""
        try:
            return cls(int(code))
        except ValueError:
            return int(code)


def device_type_name(code: int) -> str:
    """The DLPack name of CODE ("cuda"), or "dlpack device type N" for one this table lacks."""
    dt = DLDeviceType.of(code)
    return str(dt) if isinstance(dt, DLDeviceType) else f"dlpack device type {dt}"


# the kinds that are host memory (pinned or not): a framework addresses them as its CPU
HOST_KINDS = frozenset({DLDeviceType.CPU, DLDeviceType.CUDA_HOST, DLDeviceType.ROCM_HOST})
# the kinds whose memory torch orders by a stream (torch.cuda: CUDA, and HIP on ROCm builds)
STREAM_KINDS = frozenset({DLDeviceType.CUDA, DLDeviceType.ROCM})
# the memory a framework imports, by the kind it was exported as: host kinds import as CPU
IMPORT_AS = {DLDeviceType.CPU: DLDeviceType.CPU, DLDeviceType.CUDA: DLDeviceType.CUDA,
             DLDeviceType.CUDA_HOST: DLDeviceType.CPU, DLDeviceType.ROCM: DLDeviceType.ROCM,
             DLDeviceType.ROCM_HOST: DLDeviceType.CPU, DLDeviceType.ONEAPI: DLDeviceType.ONEAPI}
# torch's device type for each kind it can address (ROCm builds of torch call HIP "cuda")
TORCH_DEVICE_TYPE = {DLDeviceType.CPU: "cpu", DLDeviceType.CUDA: "cuda", DLDeviceType.CUDA_HOST: "cpu",
                     DLDeviceType.ROCM: "cuda", DLDeviceType.ROCM_HOST: "cpu", DLDeviceType.ONEAPI: "xpu"}
_POINTER_LIMIT = 1 << (8 * ctypes.sizeof(c_void_p))


def native_stream(name: str, device_type: int, stream) -> int | None:
    """The consumer's stream of a DLPack export as the backend's native handle (an int, or None
    for NULL), after the DLPack rules: an int >= -1 or None; -1 asks for no synchronisation.
    CUDA: None and -1 are the legacy default stream (1, cudaStreamLegacy), 2 the per-thread one,
    0 is ambiguous and refused, anything else a cudaStream_t. Host memory takes None (-1 too);
    another value is passed on, and the library refuses it naming the tensor."""
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int)):
        raise TypeError(f"tensor '{name}': __dlpack__ stream must be an int (the consumer's stream) or None, "
                        f"not {type(stream).__name__}")
    if stream is not None and not -1 <= stream < _POINTER_LIMIT:
        raise ValueError(f"tensor '{name}': __dlpack__ stream {stream} is not a stream: DLPack streams are -1 "
                         f"(no synchronisation), None, or a stream handle (an int from 0 to {_POINTER_LIMIT - 1})")
    if device_type == DLDeviceType.CUDA:
        if stream == 0:
            raise ValueError(f"tensor '{name}': __dlpack__ stream 0 is ambiguous for CUDA under DLPack; pass 1 for "
                             "the legacy default stream, 2 for the per-thread default stream, or the stream's handle")
        return 1 if stream is None or stream == -1 else stream
    return None if stream is None or stream == -1 else stream


def capsule(owner, state_ptr, index: int, stream, data: int, shape, dtype_name: str, device_type: int,
            device_id: int):
    """A "dltensor" capsule of tensor INDEX of the C state (C-contiguous at DATA), lent through
    sl_state_export for the consumer's STREAM (native_stream's value); OWNER stays alive, and the
    export unreleased, until the consumer lets the tensor go."""
    from . import _capi
    lib = _capi.lib()
    err = ctypes.create_string_buffer(1024)
    opts = _capi.ExportOptions(ctypes.sizeof(_capi.ExportOptions), stream, ctypes.cast(err, c_void_p),
                               ctypes.sizeof(err))
    export = c_void_p()
    status = lib.sl_state_export(state_ptr, index, ctypes.byref(opts), ctypes.byref(export))
    if status != 0:
        from . import ShardloadError
        raise ShardloadError(status, _capi.text(err.value))
    try:
        code, bits = DL_DTYPES[dtype_name]
        ndim = len(shape)
        shape_arr = (c_int64 * max(ndim, 1))(*shape)
        strides = [1] * ndim
        for i in range(ndim - 2, -1, -1):
            strides[i] = strides[i + 1] * max(int(shape[i + 1]), 1)
        strides_arr = (c_int64 * max(ndim, 1))(*strides)
        m = DLManagedTensor()
        m.dl_tensor.data = data
        m.dl_tensor.device = DLDevice(device_type, device_id)
        m.dl_tensor.ndim = ndim
        m.dl_tensor.dtype = DLDataType(code, bits, 1)
        m.dl_tensor.shape = ctypes.cast(shape_arr, POINTER(c_int64))
        m.dl_tensor.strides = ctypes.cast(strides_arr, POINTER(c_int64))
        m.dl_tensor.byte_offset = 0
        m.deleter = _deleter
        addr = ctypes.addressof(m)
        with _lock:
            _live[addr] = (owner, m, shape_arr, strides_arr, export.value, lib.sl_export_release)
    except BaseException:
        lib.sl_export_release(export)
        raise
    try:
        return _py.PyCapsule_New(addr, _NAME, ctypes.cast(_capsule_destructor, c_void_p))
    except BaseException:
        with _lock:
            entry = _live.pop(addr, None)
        _release(entry)
        raise
