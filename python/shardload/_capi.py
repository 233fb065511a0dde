"""ctypes declarations of libshardload's public C API (core/include/shardload/shardload.h).

Only the public API is used. Every struct mirrors the header field for field; the versioned
ones (options, geometry, stats, binding, memory tensors) carry `size`, which is set to the
ctypes sizeof so the library reads exactly the fields declared here. Each names its C struct in
`_c_name_`: python/tests/unit/test_layout.py compiles the header and compares every size and
offset, so a field added, moved or retyped on one side only fails there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int64,
                    c_size_t, c_uint, c_uint64, c_void_p)
from pathlib import Path

from . import _nccl

SL_MAX_DIMS = 8
SL_MAX_MESH_DIMS = 4

# sl_cpu_offload
CPU_OFFLOAD_INFER, CPU_OFFLOAD_ON, CPU_OFFLOAD_OFF = 0, 1, 2
# sl_offload_kind
OFFLOAD_NONE, OFFLOAD_CPU = 0, 1
# sl_device_kind
DEVICE_CPU, DEVICE_ACCELERATOR = 1, 2
# sl_strategy / sl_read_mode
STRATEGY_SCATTER, STRATEGY_BROADCAST = 0, 1
READ_RANK0, READ_EVERY_RANK, READ_READERS = 0, 1, 2

# sl_dtype: never renumbered (shardload.h)
DTYPES = {
    1: "F64", 2: "F32", 3: "F16", 4: "BF16", 5: "F8_E4M3", 6: "F8_E5M2", 7: "I64", 8: "I32",
    9: "I16", 10: "I8", 11: "U8", 12: "BOOL", 13: "U16", 14: "U32", 15: "U64",
}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}


class OffloadPolicy(Structure):
    _c_name_ = "sl_offload_policy"
    _fields_ = [("kind", c_int), ("pin_memory", c_int)]


class PlacementDecision(Structure):
    _c_name_ = "sl_placement_decision"
    _fields_ = [("device", c_int), ("rule", c_int), ("pin_memory", c_int)]


LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class ContextOptions(Structure):
    _c_name_ = "sl_context_options"
    _fields_ = [
        ("size", c_size_t), ("backend", c_char_p), ("collective", c_char_p),
        ("world_size", c_int), ("rank", c_int), ("local_rank", c_int),
        ("rendezvous", c_char_p), ("timeout_ms", c_int), ("log", LOG_FN), ("log_user", c_void_p),
        ("log_level", c_int), ("errbuf", c_void_p), ("errbuf_size", c_size_t),
        ("job_key", c_char_p), ("device", c_int), ("device_set", c_int),
    ]


class SourceTensor(Structure):
    _c_name_ = "sl_source_tensor"
    _fields_ = [
        ("name", c_char_p), ("dtype", c_int), ("ndim", c_int), ("shape", c_int64 * SL_MAX_DIMS),
        ("nbytes", c_uint64), ("file", c_char_p), ("file_offset", c_uint64),
    ]


class MemoryTensor(Structure):
    _c_name_ = "sl_memory_tensor"
    _fields_ = [
        ("size", c_size_t), ("name", c_char_p), ("dtype", c_int), ("ndim", c_int),
        ("shape", c_int64 * SL_MAX_DIMS), ("data", c_void_p),
    ]


class ShardGeometry(Structure):
    _c_name_ = "sl_shard_geometry"
    _fields_ = [
        ("size", c_size_t), ("ndim", c_int), ("local_shape", c_int64 * SL_MAX_DIMS),
        ("global_offset", c_int64 * SL_MAX_DIMS), ("dtype", c_int), ("replicated", c_int),
        ("nbytes", c_uint64), ("skipped", c_int),
    ]


class Tensor(Structure):
    _c_name_ = "sl_tensor"
    _fields_ = [
        ("name", c_char_p), ("dtype", c_int), ("file_dtype", c_int), ("ndim", c_int),
        ("global_shape", c_int64 * SL_MAX_DIMS), ("local_shape", c_int64 * SL_MAX_DIMS),
        ("global_offset", c_int64 * SL_MAX_DIMS), ("device", c_int), ("rule", c_int),
        ("pinned", c_int), ("caller_buffer", c_int), ("data", c_void_p), ("nbytes", c_uint64),
        ("device_type", c_int), ("device_id", c_int),
    ]


class Binding(Structure):
    _c_name_ = "sl_binding"
    _fields_ = [("size", c_size_t), ("data", c_void_p), ("pinned", c_int),
                ("message", c_char * 256)]


BIND_BUFFER_FN = CFUNCTYPE(c_int, c_void_p, POINTER(Tensor), POINTER(Binding))
PROGRESS_FN = CFUNCTYPE(None, c_void_p, c_uint64, c_uint64)
# sl_load_options.progress_status: a status, and a message into (char *, size_t)
PROGRESS_STATUS_FN = CFUNCTYPE(c_int, c_void_p, c_uint64, c_uint64, c_void_p, c_size_t)
READ_FN = CFUNCTYPE(c_int, c_void_p, c_size_t, c_uint64, c_void_p, c_size_t, c_void_p, c_size_t)


class LoadOptions(Structure):
    _c_name_ = "sl_load_options"
    _fields_ = [
        ("size", c_size_t), ("cpu_offload", c_int), ("strategy", c_int), ("read_mode", c_int),
        ("staging_bytes", c_size_t), ("bind", c_void_p), ("bind_user", c_void_p),
        ("progress", PROGRESS_FN), ("progress_user", c_void_p),
        ("bind_buffer", BIND_BUFFER_FN), ("bind_buffer_user", c_void_p),
        ("pipeline_slots", c_int), ("readers", c_int), ("progress_status", PROGRESS_STATUS_FN),
    ]


class LoadStats(Structure):
    _c_name_ = "sl_load_stats"
    _fields_ = [
        ("size", c_size_t), ("bytes_read", c_uint64), ("bytes_sent", c_uint64),
        ("bytes_received", c_uint64), ("bytes_h2d", c_uint64), ("staging_bytes", c_uint64),
        ("seconds", c_double), ("bytes_d2h", c_uint64), ("device_staging_bytes", c_uint64),
        ("transfers", c_uint64), ("seconds_read", c_double), ("seconds_wait", c_double),
        ("seconds_phase1", c_double), ("rounds", c_uint64),
    ]


class ExportOptions(Structure):
    _c_name_ = "sl_export_options"
    _fields_ = [("size", c_size_t), ("stream", c_void_p), ("errbuf", c_void_p), ("errbuf_size", c_size_t)]


class LibraryNotFound(OSError):
    """libshardload could not be found; the message lists where it was looked for."""


def _candidates() -> list[tuple[str, str]]:
    """(path, why) in the order they are tried."""
    out: list[tuple[str, str]] = []
    env = os.environ.get("SHARDLOAD_LIBRARY")
    if env:
        return [(env, "$SHARDLOAD_LIBRARY")]
    here = Path(__file__).resolve().parent
    # a wheel carries the library (and its modules, found next to it) in the package
    for p in sorted((here / "_lib").glob("libshardload.so*")):
        out.append((str(p), "bundled in the package"))
    # a source checkout: python/shardload/ inside the repository, built with a preset
    root = here.parent.parent
    if (root / "CMakePresets.json").is_file():
        for preset in ("cuda", "cpu"):
            p = root / "build" / preset / "libshardload.so"
            if p.exists():
                out.append((str(p), f"the source tree's build/{preset}"))
    # installed (cmake --install): the loader's search path, then the usual prefixes
    found = ctypes.util.find_library("shardload")
    if found:
        out.append((found, "the system library path"))
    for prefix in (os.environ.get("VIRTUAL_ENV"), "/usr/local", "/usr"):
        if prefix:
            for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
                p = Path(prefix) / lib / "libshardload.so.0"
                if p.exists():
                    out.append((str(p), f"{prefix}/{lib}"))
    return out


def _declare(lib: ctypes.CDLL) -> None:
    S = c_int  # sl_status
    ctx, src, plan, st = c_void_p, c_void_p, c_void_p, c_void_p
    sigs = {
        "sl_version": (c_uint, []),
        "sl_version_string": (c_char_p, []),
        "sl_status_name": (c_char_p, [c_int]),
        "sl_strerror": (c_char_p, [c_int]),
        "sl_dtype_name": (c_char_p, [c_int]),
        "sl_dtype_from_name": (c_int, [c_char_p]),
        "sl_dtype_size": (c_size_t, [c_int]),
        "sl_resolve_placement": (S, [c_int, POINTER(OffloadPolicy), POINTER(PlacementDecision)]),
        "sl_placement_rule_describe": (c_char_p, [c_int]),
        "sl_device_kind_name": (c_char_p, [c_int]),
        "sl_context_create": (S, [POINTER(ContextOptions), POINTER(c_void_p)]),
        "sl_context_destroy": (None, [ctx]),
        "sl_context_abort": (None, [ctx]),
        "sl_context_errmsg": (c_char_p, [ctx]),
        "sl_context_rank": (c_int, [ctx]),
        "sl_context_world_size": (c_int, [ctx]),
        "sl_context_backend_name": (c_char_p, [ctx]),
        "sl_context_backend_reason": (c_char_p, [ctx]),
        "sl_context_collective_name": (c_char_p, [ctx]),
        "sl_context_collective_reason": (c_char_p, [ctx]),
        "sl_context_device_description": (c_char_p, [ctx]),
        "sl_context_agree": (S, [ctx, c_int]),
        "sl_context_set_error": (S, [ctx, c_int, c_char_p]),
        "sl_source_open": (S, [ctx, c_char_p, POINTER(c_void_p)]),
        "sl_source_open_memory": (S, [ctx, c_char_p, POINTER(MemoryTensor), c_size_t, READ_FN,
                                      c_void_p, POINTER(c_void_p)]),
        "sl_source_destroy": (None, [src]),
        "sl_source_tensor_count": (c_size_t, [src]),
        "sl_source_tensor_at": (POINTER(SourceTensor), [src, c_size_t]),
        "sl_source_find": (POINTER(SourceTensor), [src, c_char_p]),
        "sl_source_file_count": (c_size_t, [src]),
        "sl_source_file_at": (c_char_p, [src, c_size_t]),
        "sl_source_total_bytes": (c_uint64, [src]),
        "sl_source_metadata_count": (c_size_t, [src]),
        "sl_source_metadata_at": (S, [src, c_size_t, POINTER(c_char_p), POINTER(c_char_p)]),
        "sl_plan_create": (S, [ctx, POINTER(c_void_p)]),
        "sl_plan_destroy": (None, [plan]),
        "sl_plan_set_mesh": (S, [plan, c_int, POINTER(c_int)]),
        "sl_plan_set_offload_policy": (S, [plan, POINTER(OffloadPolicy)]),
        "sl_plan_set_param_dtype": (S, [plan, c_int]),
        "sl_plan_set_default_placement": (S, [plan, c_char_p]),
        "sl_plan_add_rule": (S, [plan, c_char_p, c_char_p, c_int]),
        "sl_plan_add_entry": (S, [plan, c_char_p, c_char_p, c_int]),
        "sl_plan_set_strict": (S, [plan, c_int]),
        "sl_plan_load_json": (S, [plan, c_char_p]),
        "sl_plan_mesh": (c_int, [plan, c_int, POINTER(c_int)]),
        "sl_plan_check": (S, [plan, src, c_int]),
        "sl_plan_geometry": (S, [plan, POINTER(SourceTensor), c_int, c_int, POINTER(ShardGeometry)]),
        "sl_plan_describe": (S, [plan, POINTER(SourceTensor), c_char_p, c_size_t]),
        "sl_load": (S, [ctx, plan, src, POINTER(LoadOptions), POINTER(c_void_p)]),
        "sl_state_destroy": (None, [st]),
        "sl_state_count": (c_size_t, [st]),
        "sl_state_tensor": (POINTER(Tensor), [st, c_size_t]),
        "sl_state_find": (POINTER(Tensor), [st, c_char_p]),
        "sl_state_skipped_count": (c_size_t, [st]),
        "sl_state_skipped_at": (c_char_p, [st, c_size_t]),
        "sl_state_stats": (S, [st, POINTER(LoadStats)]),
        "sl_state_export": (S, [st, c_size_t, POINTER(ExportOptions), POINTER(c_void_p)]),
        "sl_export_tensor": (POINTER(Tensor), [c_void_p]),
        "sl_export_release": (None, [c_void_p]),
    }
    optional = {"sl_source_open_memory"}  # newer than the first public API: checked at use
    for name, (res, args) in sigs.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            if name in optional:
                continue
            raise LibraryNotFound(f"{lib._name}: has no {name}: an older libshardload than this "
                                  f"package; rebuild it or point SHARDLOAD_LIBRARY at a newer one") from e
        fn.restype = res
        fn.argtypes = args


_lib: ctypes.CDLL | None = None


def _absolute(path: str) -> str:
    """PATH as the real absolute file, resolved once, here. The library finds its modules in
    its own directory as the dynamic loader recorded it; a relative path would make that
    directory relative to whatever the current directory is at each later lookup, so a chdir
    could make it load a module planted there. A bare name (no slash) is left to the dynamic
    loader's own search."""
    return os.path.realpath(path) if "/" in path else path


def lib() -> ctypes.CDLL:
    """The loaded libshardload (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    _nccl.export_wheel_nccl(os.environ)  # before any module loads: where the NCCL module looks
    for path, why in _candidates():
        path = _absolute(path)
        try:
            handle = ctypes.CDLL(path)
            _declare(handle)
        except OSError as e:  # LibraryNotFound (an older library) included: try the next
            tried.append(f"{path} ({why}): {e}")
            continue
        _lib = handle
        return handle
    where = "; ".join(tried) if tried else "nothing found"
    raise LibraryNotFound(
        "libshardload not found (" + where + "). Install the package with it (pip install . from the "
        "repository root, or a wheel from scripts/wheel.sh), build it (cmake --workflow --preset cpu in the "
        "source tree), install it (cmake --install), or set SHARDLOAD_LIBRARY=/path/to/libshardload.so")


def text(b: bytes | None) -> str:
    return b.decode("utf-8", "replace") if b is not None else ""


class _StatusBase(enum.IntEnum):
    """sl_status: the members come from the loaded library's own table (status.h), never from
    numbers written here."""

    @property
    def c_name(self) -> str:
        """The stable C name, e.g. "SL_ERR_FORMAT" (sl_status_name)."""
        return text(lib().sl_status_name(int(self)))

    @property
    def message(self) -> str:
        """The generic message, e.g. "malformed checkpoint" (sl_strerror)."""
        return text(lib().sl_strerror(int(self)))


_status: type[_StatusBase] | None = None
_UNKNOWN_STATUS = "SL_ERR_UNKNOWN"  # what sl_status_name says past the end of the table
_STATUS_LIMIT = 1 << 12  # a bound on the walk only, should a library never say UNKNOWN


def status_enum() -> type[_StatusBase]:
    """The Status enum, built on first use from sl_status_name over 0, 1, ... until the library
    says SL_ERR_UNKNOWN (codes are dense and never renumbered: new ones go at the end)."""
    global _status
    if _status is None:
        members = {}
        for code in range(_STATUS_LIMIT):
            name = text(lib().sl_status_name(code))
            if name == _UNKNOWN_STATUS or not name.startswith("SL_"):
                break
            members[name[len("SL_"):]] = code
        _status = _StatusBase("Status", members, module="shardload", qualname="Status")
    return _status


def status(code: int):
    """CODE as a Status member, or the int itself for a code outside the library's table."""
    try:
        return status_enum()(int(code))
    except ValueError:
        return int(code)
