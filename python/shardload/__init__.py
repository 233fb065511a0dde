"""shardload: load a full safetensors checkpoint (or a rank 0 state dict) into sharded, placed
per-rank tensors, from Python.

A thin layer over libshardload's public C API (ctypes). torch is optional: inspection and
planning work without it; loaded shards come back as torch tensors through DLPack (zero copy)
when it is installed.

    import shardload
    with shardload.Context() as ctx:                     # launcher env, or an existing process group
        src = ctx.open("/ckpt")                          # file, index.json or directory
        plan = ctx.plan(mesh=[ctx.world_size], param_dtype="bfloat16")
        state = ctx.load(plan, src, cpu_offload=None)    # None: follow the plan's offload policy
        for name, t in state.items():
            w = t.to_torch()                             # the local shard, zero copy

torch's vocabulary is accepted wherever torch is importable (torch.bfloat16, torch.device("cuda:1"),
a ProcessGroup) and offered beside the library's names (`.torch_dtype`, `.torch_device`); errors
carry a `Status` (built from the library's own table) and DLPack device kinds are named
(`DLDeviceType`, str() "cuda").
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
from ctypes import byref, c_char_p, c_int, c_void_p, sizeof
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from . import _calls, _capi, _progress
from ._group import device_arg, env_int, process_group_rendezvous
from ._placement import Placement, policy as _policy, resolve_placement, spelling as _spelling, tri as _tri
from ._calls import Trap, TrapRef, blocking
from ._capi import LibraryNotFound
from ._convert import SIZE_MAX, cint, cmsg, cpath, cstr, ctimeout_ms
from ._dlpack import DLDeviceType, TORCH_DEVICE_TYPE, IMPORT_AS, device_type_name

__all__ = ["Context", "Source", "Plan", "State", "LoadedTensor", "SourceTensor", "ShardloadError",
           "LibraryNotFound", "Placement", "Status", "DLDeviceType", "resolve_placement", "version",
           "library_path"]

_log = logging.getLogger("shardload")


def __getattr__(name: str):
    """shardload.Status, built from the library's table the first time it is asked for (so that
    `import shardload` works before the library is found, and says so only at first use)."""
    if name == "Status":
        return _capi.status_enum()
    raise AttributeError(f"module 'shardload' has no attribute {name!r}")


class ShardloadError(RuntimeError):
    """A libshardload failure: `status` (a Status member, an IntEnum: it compares equal to the C
    value), `status_name` ("SL_ERR_FORMAT") and the C message."""

    def __init__(self, status: int, message: str):
        self.status = _capi.status(status)
        self.status_name = _capi.text(_capi.lib().sl_status_name(int(self.status)))
        self.message = message or _capi.text(_capi.lib().sl_strerror(self.status))
        super().__init__(f"{self.message} [{self.status_name}]")


def version() -> str:
    """The loaded libshardload's version ("MAJOR.MINOR.PATCH")."""
    return _capi.text(_capi.lib().sl_version_string())


def library_path() -> str:
    """The path libshardload was loaded from."""
    return _capi.lib()._name


# ---- context -----------------------------------------------------------------------------

_LOG_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


@_capi.LOG_FN
def _log_cb(user, level, msg, _log=_log, _levels=_LOG_LEVELS):
    try:
        _log.log(_levels.get(level, logging.DEBUG), "%s", msg.decode("utf-8", "replace") if msg else "")
    except BaseException:  # a handler's failure (or interpreter shutdown) never reaches C
        pass


ctypes.pythonapi.Py_IncRef.restype = None
ctypes.pythonapi.Py_IncRef.argtypes = [ctypes.py_object]
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_log_cb))  # immortal, like the DLPack callbacks


# contexts of each world size (> 1) this process began to create (Context.__init__)
_contexts_made: dict[int, int] = collections.defaultdict(int)


def _launcher_world() -> int:
    """$WORLD_SIZE as the C side reads it for a context without world_size (a bad value: C names it)."""
    try:
        return env_int("WORLD_SIZE", 1)
    except ValueError:
        return 0


class Context:
    """A job's ranks, backend and data plane (sl_context). Collective: every rank creates it.

    world_size=None: the ranks of PROCESS_GROUP (a torch ProcessGroup; None: the default group
    when one is initialised, use_process_group=False to ignore it), reusing its store, else the
    launcher environment (torchrun, Slurm, Open MPI; none: rank 0 of 1). Only the group's
    members create its context, each in the same order with respect to its other contexts of
    the same world size (the library numbers contexts per world size, docs/DESIGN.md#rendezvous).
    device: an ordinal on the node, a torch.device or its string ("cuda:1", "cpu"); a device type
    picks the backend that drives it (cuda, hip, level_zero for xpu, cpu) when BACKEND is None."""

    def __init__(self, backend: str | None = None, collective: str | None = None, *,
                 world_size: int | None = None, rank: int | None = None, local_rank: int | None = None,
                 rendezvous: str | None = None, timeout: float = 300.0, device=None,
                 job_key: str | None = None, use_process_group: bool = True, process_group=None):
        lib = _capi.lib()
        if process_group is not None and (world_size is not None or not use_process_group):
            raise ValueError("Context: process_group names the ranks: pass it without world_size and "
                             "use_process_group=False")
        device, backend = device_arg(device, backend)
        self._ptr = c_void_p()
        self._inflight: list = []  # the done-events of calls that may still use the context
        o = _capi.ContextOptions()
        o.size = sizeof(o)
        o.backend, o.collective = cstr(backend, "backend"), cstr(collective, "collective")
        pg = process_group_rendezvous(process_group) if use_process_group and world_size is None else None
        key = job_key
        self._rdzv_dir = None
        if pg is not None:
            world_size, rank, lr, pg_rdzv, pg_key = pg
            local_rank = lr if local_rank is None else local_rank
            if rendezvous is None:
                rendezvous = pg_rdzv
                if pg_rdzv.startswith("file://") and rank == 0:
                    self._rdzv_dir = pg_rdzv[len("file://"):]
            # contexts made one after another in one job meet under distinct keys
            key = pg_key + (f":{job_key}" if job_key else "")
        if world_size is not None:
            if rank is None:
                raise ValueError("Context: world_size given without rank")
            # 0 would mean "from the launcher environment" to C: a given world size is >= 1
            o.world_size = cint(world_size, "world_size", 1)
            o.rank = cint(rank, "rank", 0, o.world_size - 1)
            if local_rank is None:
                local_rank = env_int("LOCAL_RANK", o.rank)
            o.local_rank = cint(local_rank, "local_rank")
        o.rendezvous = cstr(rendezvous, "rendezvous")
        o.timeout_ms = ctimeout_ms(timeout)
        o.log = _log_cb
        eff = _log.getEffectiveLevel()
        o.log_level = 3 if eff <= logging.DEBUG else 2 if eff <= logging.INFO else 1 if eff <= logging.WARNING else 0
        errbuf = ctypes.create_string_buffer(1024)
        o.errbuf, o.errbuf_size = ctypes.cast(errbuf, c_void_p), sizeof(errbuf)
        o.job_key = cstr(key, "job_key")
        if device is not None:
            o.device, o.device_set = cint(device, "device"), 1
        self._opts = o  # strings referenced by the options live as long as the context
        out = c_void_p()  # written by the worker; ours only once creation returned here

        def undo(s, out=out, keep=(o, errbuf)):  # creation that finished after an interrupt
            if s == 0 and out:
                lib.sl_context_destroy(out)
        # libshardload numbers this process's contexts per world size (> 1), and a subgroup's
        # ranks must agree on the number (shardload.torch checks): count every one made here
        n = o.world_size if world_size is not None else _launcher_world()
        if n > 1:
            _contexts_made[n] += 1
        # no context to abort while the rendezvous waits: an interrupt leaves it to finish alone
        s = blocking(lib.sl_context_create, byref(o), byref(out), undo=undo)
        if s:
            raise ShardloadError(s, errbuf.value.decode("utf-8", "replace"))
        self._ptr = out

    # -- lifetime
    def close(self) -> None:
        """Destroys the context (collective in spirit: every rank closes). States it loaded stay valid."""
        for done in getattr(self, "_inflight", ()):
            done.wait()  # a call interrupted twice may still run: it ends within the timeout
        p, self._ptr = getattr(self, "_ptr", None), c_void_p()
        if p:
            _capi.lib().sl_context_destroy(p)
            d, self._rdzv_dir = getattr(self, "_rdzv_dir", None), None
            if d:  # every rank connected before creation returned anywhere: its keys are spent
                import shutil
                shutil.rmtree(d, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _check(self, s: int) -> None:
        if s:
            raise ShardloadError(s, _capi.text(_capi.lib().sl_context_errmsg(self._p)))

    def _blocking(self, fn, *args, trap: Trap | None = None, undo=None):
        """fn(self._p, *args), a collective C call, ended on every rank by a signal (_calls)."""
        p = self._p
        self._inflight = [d for d in self._inflight if not d.is_set()]
        return blocking(fn, p, *args, abort=lambda: _capi.lib().sl_context_abort(p), trap=trap,
                        undo=undo, started=self._inflight.append)

    @property
    def _p(self):
        if not self._ptr:
            raise ValueError("shardload context is closed")
        return self._ptr

    # -- facts
    @property
    def rank(self) -> int:
        return _capi.lib().sl_context_rank(self._p)

    @property
    def world_size(self) -> int:
        return _capi.lib().sl_context_world_size(self._p)

    @property
    def backend(self) -> str:
        return _capi.text(_capi.lib().sl_context_backend_name(self._p))

    @property
    def backend_reason(self) -> str:
        return _capi.text(_capi.lib().sl_context_backend_reason(self._p))

    @property
    def collective(self) -> str:
        return _capi.text(_capi.lib().sl_context_collective_name(self._p))

    @property
    def collective_reason(self) -> str:
        return _capi.text(_capi.lib().sl_context_collective_reason(self._p))

    @property
    def device_description(self) -> str:
        return _capi.text(_capi.lib().sl_context_device_description(self._p))

    def agree(self, ok: bool | BaseException = True, message: str = "") -> None:
        """Every rank passes its own outcome; raises the lowest failing rank's error on every rank."""
        lib = _capi.lib()
        if ok is True:
            s = 0
        else:
            msg = message or (_calls.text_of(ok) if isinstance(ok, BaseException) else "failed")
            s = lib.sl_context_set_error(self._p, 1, cmsg(msg))
        self._check(self._blocking(lib.sl_context_agree, s))

    # -- objects
    def open(self, path: str | os.PathLike) -> "Source":
        """A checkpoint: a .safetensors file, an index.json or a directory holding one (collective)."""
        lib = _capi.lib()
        p = c_void_p()
        self._check(self._blocking(lib.sl_source_open, cpath(path), byref(p),
                                   undo=lambda s: lib.sl_source_destroy(p) if s == 0 else None))
        return Source(self, p, keep=None)

    def open_state_dict(self, state_dict: Mapping[str, Any] | None, label: str = "state dict") -> "Source":
        """A source whose tensors are rank 0's STATE_DICT (torch tensors; other ranks pass None).
        Loads from it read on rank 0 only; the tensors must stay alive as long as the Source."""
        lib = _capi.lib()
        label_c = cstr(label, "label")
        table = read = keep = None
        reads = TrapRef()
        err: BaseException | bool = True
        if self.rank == 0:
            try:
                from ._torch import memory_table
                table, read, keep = memory_table(state_dict, reads)
            except Exception as e:  # every rank learns it, rather than waiting for rank 0
                err = e
            except BaseException:  # an interrupt: the others fail at once, not at the timeout
                lib.sl_context_abort(self._p)
                raise
        self.agree(err)
        arr = None
        if table:
            arr = (_capi.MemoryTensor * len(table))(*table)
        if not hasattr(lib, "sl_source_open_memory") or lib.sl_source_open_memory.argtypes is None:
            raise ShardloadError(_capi.status_enum().ERR_UNSUPPORTED,
                                 f"{library_path()} predates sl_source_open_memory: rebuild libshardload "
                                 "or pass a checkpoint path")
        p = c_void_p()
        cb = _capi.READ_FN(read) if read is not None else _capi.READ_FN()
        self._check(self._blocking(lib.sl_source_open_memory, label_c, arr, len(table or ()), cb, None, byref(p),
                                   undo=lambda s: lib.sl_source_destroy(p) if s == 0 else None))
        return Source(self, p, keep=(arr, cb, keep), reads=reads)

    def plan(self, **kw) -> "Plan":
        return Plan(self, **kw)

    def load(self, plan: "Plan", source: "Source", *, cpu_offload: bool | None = None,
             strategy: str = "scatter", read_mode: str = "rank0", staging_bytes: int = 0,
             pipeline_slots: int = 0, readers: int = 0, bind: Callable[["LoadedTensor"], Any] | None = None,
             progress: Callable[..., None] | None = None, progress_bar: bool | None = None) -> "State":
        """Loads SOURCE under PLAN (collective). cpu_offload: True = CPU, False = the accelerator,
        None = the plan's offload policy decides. read_mode "rank0" (only rank 0 reads),
        "every-rank" or "readers" (distributed readers: READERS ranks, 0 = one per host, each read
        a share and send it). bind(t) may return a torch tensor (contiguous, at least t.nbytes, on t's
        device) to be filled in place, or None to let the state own one.
        progress(done_bytes, total_bytes, done_tensors, total_tensors) is called on rank 0 only
        (the library reports there) after each tensor whose bytes are all in place, from the
        load's thread; the totals are of the tensors the plan takes, bytes as in the file. A
        callable of two parameters gets (done_bytes, total_bytes). progress_bar: a tqdm bar on
        rank 0 (True/False; None: $SHARDLOAD_PROGRESS=1/0, else when stderr is a terminal and
        tqdm is installed). An exception in
        bind, progress or a state dict's read fails the load on every rank; an exception that is
        not an Exception (KeyboardInterrupt, SystemExit) is raised as it is, others as the
        ShardloadError they caused. A signal during the load aborts the context
        (sl_context_abort): it is then only good for close()."""
        lib = _capi.lib()
        o = _capi.LoadOptions()
        o.size = sizeof(o)
        o.cpu_offload = _tri(cpu_offload)
        strategies = {"scatter": _capi.STRATEGY_SCATTER, "broadcast": _capi.STRATEGY_BROADCAST}
        modes = {"rank0": _capi.READ_RANK0, "every-rank": _capi.READ_EVERY_RANK, "readers": _capi.READ_READERS}
        read_mode = _spelling(read_mode, "read_mode")
        if strategy not in strategies or read_mode not in modes:
            raise ValueError(f"strategy must be one of {list(strategies)}, read_mode one of {list(modes)}")
        o.strategy, o.read_mode = strategies[strategy], modes[read_mode]
        o.staging_bytes = cint(staging_bytes, "staging_bytes", 0, SIZE_MAX)
        o.pipeline_slots = cint(pipeline_slots, "pipeline_slots")
        o.readers = cint(readers, "readers")
        ctx_p, plan_p, src_p = self._p, plan._p, source._p
        trap = Trap()
        binder = _Binder(bind, trap) if bind is not None else None
        if binder is not None:
            o.bind_buffer = binder.cfn
        bar = _progress.bar_wanted(progress_bar) and self.rank == 0
        tracker = None
        if progress is not None or bar:
            if progress is not None and not callable(progress):
                raise TypeError(f"progress must be a callable (done_bytes, total_bytes, done_tensors, total_tensors), "
                                f"not {type(progress).__name__}")
            if self.rank == 0:  # the library reports on rank 0 only
                tracker = _progress.LoadProgress(progress, bar, plan._taken_sizes(source, self.world_size))
                o.progress_status = _calls.progress_callback(tracker, trap)
        p = c_void_p()
        reads = source._reads
        if reads is not None:
            reads.trap = trap
        try:
            s = self._blocking(lib.sl_load, plan_p, src_p, byref(o), byref(p), trap=trap,
                               undo=lambda s: lib.sl_state_destroy(p) if s == 0 else None)
        finally:
            if reads is not None:
                reads.trap = None
            if tracker is not None:
                tracker.close()
        if trap.exc is not None:
            if s == 0:  # cannot be (every callback failure fails the load): never hand it out
                lib.sl_state_destroy(p)
            if not isinstance(trap.exc, Exception):
                raise trap.exc  # KeyboardInterrupt, SystemExit...: as the callback raised it
            raise ShardloadError(s or _capi.status_enum().ERR_INVALID,
                                 _capi.text(lib.sl_context_errmsg(ctx_p))) from trap.exc
        self._check(s)
        return State(p, buffers=binder.buffers if binder else {})


class _Binder:
    """sl_bind_buffer_fn over a Python callable; keeps the buffers it hands out alive."""

    def __init__(self, fn, trap: Trap):
        self.fn, self.trap, self.buffers, self.synced = fn, trap, {}, set()
        self.ok, self.refused = int(_capi.status_enum().OK), int(_capi.status_enum().ERR_BUFFER)
        self.cfn = _capi.BIND_BUFFER_FN(self._call)

    def _call(self, user, t, out):
        try:
            if self.trap.cancelled:
                raise KeyboardInterrupt("the load was interrupted")
            info = LoadedTensor._from_c(t.contents, None)
            buf = self.fn(info)
            if buf is None:
                out.contents.data = None
                return self.ok
            from ._torch import check_buffer
            ptr, pinned = check_buffer(info, buf)
            if buf.device.type == "cuda" and buf.device not in self.synced:
                # the library writes on its own streams: work torch still has queued on this
                # memory (an initialisation, the caching allocator's previous user) finishes first
                import torch
                torch.cuda.synchronize(buf.device)
                self.synced.add(buf.device)
            self.buffers[info.name] = buf
            out.contents.data = ptr
            out.contents.pinned = int(pinned)
            return self.ok
        except BaseException as e:  # becomes this rank's bind failure, reported on every rank
            self.trap.catch(e, "bind")
            out.contents.message = _calls.describe(e, 255)
            return self.refused


# ---- source ------------------------------------------------------------------------------

def _torch_dtype(name: str):
    """torch's dtype of a shardload dtype name (F8 as torch.float8_e4m3fn / float8_e5m2)."""
    try:
        from ._torch import torch_dtype
    except ImportError as e:
        raise ImportError(f"torch_dtype needs torch, which is not importable here ({e}): pip install torch, "
                          "or use .dtype (the safetensors name)") from e
    return torch_dtype(name)


@dataclass(frozen=True)
class SourceTensor:
    name: str
    dtype: str             # the safetensors name ("BF16"); torch_dtype: torch's
    shape: tuple[int, ...]
    nbytes: int
    file: str
    file_offset: int

    @property
    def torch_dtype(self):
        return _torch_dtype(self.dtype)


def _src_tensor(t) -> SourceTensor:
    return SourceTensor(_capi.text(t.name), _capi.DTYPES.get(t.dtype, "?"), tuple(t.shape[: t.ndim]),
                        int(t.nbytes), _capi.text(t.file), int(t.file_offset))


class Source:
    """A checkpoint's tensor table (sl_source); iterating yields SourceTensor in file order."""

    def __init__(self, ctx: Context, ptr: c_void_p, keep, reads: TrapRef | None = None):
        self._ctx, self._ptr, self._keep, self._reads = ctx, ptr, keep, reads

    @property
    def _p(self):
        if not self._ptr:
            raise ValueError("shardload source is closed")
        return self._ptr

    def close(self):
        p, self._ptr = getattr(self, "_ptr", None), c_void_p()
        if p:
            _capi.lib().sl_source_destroy(p)
        self._keep = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __len__(self) -> int:
        return _capi.lib().sl_source_tensor_count(self._p)

    def __iter__(self) -> Iterator[SourceTensor]:
        lib = _capi.lib()
        for i in range(len(self)):
            yield _src_tensor(lib.sl_source_tensor_at(self._p, i).contents)

    def __getitem__(self, name: str) -> SourceTensor:
        t = _capi.lib().sl_source_find(self._p, cstr(name, "tensor name"))
        if not t:
            raise KeyError(name)
        return _src_tensor(t.contents)

    def __contains__(self, name: str) -> bool:
        return bool(_capi.lib().sl_source_find(self._p, cstr(name, "tensor name")))

    def _c(self, name: str):
        t = _capi.lib().sl_source_find(self._p, cstr(name, "tensor name"))
        if not t:
            raise KeyError(f"{name!r} is not in the checkpoint")
        return t

    @property
    def files(self) -> list[str]:
        lib = _capi.lib()
        return [_capi.text(lib.sl_source_file_at(self._p, i)) for i in range(lib.sl_source_file_count(self._p))]

    @property
    def total_bytes(self) -> int:
        return int(_capi.lib().sl_source_total_bytes(self._p))

    @property
    def metadata(self) -> dict[str, str]:
        lib, out = _capi.lib(), {}
        for i in range(lib.sl_source_metadata_count(self._p)):
            k, v = c_char_p(), c_char_p()
            if lib.sl_source_metadata_at(self._p, i, byref(k), byref(v)) == 0:
                out[_capi.text(k.value)] = _capi.text(v.value)
        return out


# ---- plan --------------------------------------------------------------------------------

def _dtype_code(dt) -> int:
    if dt is None:
        return 0
    if isinstance(dt, str):
        name = dt  # safetensors, lower case or torch spellings: the library parses them
    else:
        from ._torch import dtype_name
        name = dtype_name(dt)
    code = _capi.lib().sl_dtype_from_name(cstr(name, "dtype"))
    if not code:
        raise ValueError(f"dtype {dt!r} is not one shardload knows (F64, F32, F16, BF16, F8_E4M3, F8_E5M2, "
                         "I64..I8, U64..U8, BOOL)")
    return code


class Plan:
    """How tensors are sharded, cast and offloaded (sl_plan)."""

    def __init__(self, ctx: Context, *, mesh: Sequence[int] | None = None, offload_policy=None,
                 param_dtype=None, default_placement: str | None = None, strict: bool = False,
                 json: str | os.PathLike | None = None):
        self._ctx = ctx
        self._ptr = c_void_p()
        ctx._check(_capi.lib().sl_plan_create(ctx._p, byref(self._ptr)))
        if json is not None:
            self._chk(_capi.lib().sl_plan_load_json(self._ptr, cpath(json, "plan json")))
        if mesh is not None:
            self.set_mesh(mesh)
        if offload_policy is not None:
            self.set_offload_policy(offload_policy)
        if param_dtype is not None:
            self._chk(_capi.lib().sl_plan_set_param_dtype(self._ptr, _dtype_code(param_dtype)))
        if default_placement is not None:
            spec = cstr(default_placement, "default_placement")
            self._chk(_capi.lib().sl_plan_set_default_placement(self._ptr, spec))
        if strict:
            self._chk(_capi.lib().sl_plan_set_strict(self._ptr, 1))

    def _chk(self, s):
        self._ctx._check(s)

    @property
    def _p(self):
        if not self._ptr:
            raise ValueError("shardload plan is closed")
        return self._ptr

    def close(self):
        p, self._ptr = getattr(self, "_ptr", None), c_void_p()
        if p:
            _capi.lib().sl_plan_destroy(p)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def set_mesh(self, dims: Sequence[int]) -> "Plan":
        vals = [cint(d, f"mesh[{i}]", 1) for i, d in enumerate(dims)]
        arr = (c_int * len(vals))(*vals)
        self._chk(_capi.lib().sl_plan_set_mesh(self._p, len(dims), arr))
        return self

    def set_offload_policy(self, policy) -> "Plan":
        pol = _policy(policy)
        self._chk(_capi.lib().sl_plan_set_offload_policy(self._p, byref(pol)))
        return self

    def add_rule(self, pattern: str, placement: str | None = None, dtype=None) -> "Plan":
        self._chk(_capi.lib().sl_plan_add_rule(self._p, cstr(pattern, "rule pattern"), cstr(placement, "placement"),
                                                  _dtype_code(dtype)))
        return self

    def add_entry(self, name: str, placement: str | None = None, dtype=None) -> "Plan":
        self._chk(_capi.lib().sl_plan_add_entry(self._p, cstr(name, "plan entry"), cstr(placement, "placement"),
                                                   _dtype_code(dtype)))
        return self

    def mesh(self, world: int | None = None) -> list[int]:
        dims = (c_int * _capi.SL_MAX_MESH_DIMS)()
        n = _capi.lib().sl_plan_mesh(self._p, cint(world or self._ctx.world_size, "world", 1), dims)
        return list(dims[:n])

    def check(self, source: Source, world_size: int | None = None) -> None:
        """sl_load's plan checks as a dry run: raises exactly where a load would."""
        world = cint(world_size or self._ctx.world_size, "world_size", 1)
        self._chk(_capi.lib().sl_plan_check(self._p, source._p, world))

    def geometry(self, source: Source, name: str, rank: int | None = None, world: int | None = None) -> dict:
        g = _capi.ShardGeometry()
        g.size = sizeof(g)
        rank = self._ctx.rank if rank is None else rank
        world = self._ctx.world_size if world is None else world
        world = cint(world, "world", 1)
        rank = cint(rank, "rank", 0, world - 1)
        self._chk(_capi.lib().sl_plan_geometry(self._p, source._c(name), rank, world, byref(g)))
        out = {"local_shape": tuple(g.local_shape[: g.ndim]), "global_offset": tuple(g.global_offset[: g.ndim]),
               "dtype": _capi.DTYPES.get(g.dtype, "?"), "replicated": bool(g.replicated),
               "nbytes": int(g.nbytes), "skipped": bool(g.skipped)}
        try:  # torch's dtype beside the library's name, as LoadedTensor.torch_dtype, where torch imports
            out["torch_dtype"] = _torch_dtype(out["dtype"])
        except (ImportError, KeyError):  # no torch here, or a dtype torch lacks: the name alone
            pass
        return out

    def _taken_sizes(self, source: Source, world: int) -> list[int]:
        """File bytes of the tensors a load of SOURCE takes under this plan, in file order (what
        progress counts tensors by). A tensor the plan cannot resolve is counted: the load fails
        on it, on every rank, with the message."""
        lib, g = _capi.lib(), _capi.ShardGeometry()
        g.size = sizeof(g)
        sizes = []
        for i in range(len(source)):
            t = lib.sl_source_tensor_at(source._p, i)
            s = lib.sl_plan_geometry(self._p, t, 0, world, byref(g))
            if s or not g.skipped:
                sizes.append(int(t.contents.nbytes))
        return sizes

    def describe(self, source: Source, name: str) -> str:
        buf = ctypes.create_string_buffer(256)
        self._chk(_capi.lib().sl_plan_describe(self._p, source._c(name), buf, sizeof(buf)))
        return buf.value.decode()


# ---- state -------------------------------------------------------------------------------

@dataclass
class LoadedTensor:
    """One local shard: where it lives, what it is of the global tensor, and why it is there."""
    name: str
    dtype: str             # safetensors names ("BF16"); torch_dtype: torch's
    file_dtype: str
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    device: str            # "cpu" or "device" (the rank's accelerator; host memory on the cpu backend)
    rule: str              # the placement contract's row that chose the device
    pinned: bool
    caller_buffer: bool
    nbytes: int
    data_ptr: int
    dlpack_device: tuple[DLDeviceType | int, int]  # (kind, ordinal); str(kind): "cuda", "cuda_host"...
    _state: "_Handle | None" = field(default=None, repr=False, compare=False)  # owns the memory
    _index: int = field(default=-1, repr=False, compare=False)  # in the C state (sl_state_tensor)

    @staticmethod
    def _from_c(t, state, index: int = -1) -> "LoadedTensor":
        lib = _capi.lib()
        nd = t.ndim
        return LoadedTensor(
            _capi.text(t.name), _capi.DTYPES.get(t.dtype, "?"), _capi.DTYPES.get(t.file_dtype, "?"),
            tuple(t.global_shape[:nd]), tuple(t.local_shape[:nd]), tuple(t.global_offset[:nd]),
            _capi.text(lib.sl_device_kind_name(t.device)),
            _capi.text(lib.sl_placement_rule_describe(t.rule)) if t.rule else "",
            bool(t.pinned), bool(t.caller_buffer), int(t.nbytes), int(t.data or 0),
            (DLDeviceType.of(t.device_type), int(t.device_id)), state, index)

    @property
    def device_type(self) -> str:
        """The memory's DLPack device kind by name: "cpu", "cuda", "cuda_host", "rocm",
        "rocm_host", "oneapi", "ext_dev" (the sim backend's simulated memory)."""
        return device_type_name(self.dlpack_device[0])

    @property
    def torch_device(self):
        """The torch.device to_torch() gives (cuda:N, cpu for host and pinned memory, xpu:N), or
        None for memory no framework can address (the sim backend's)."""
        kind = TORCH_DEVICE_TYPE.get(self.dlpack_device[0])
        if kind is None:
            return None
        import torch
        return torch.device(kind) if kind == "cpu" else torch.device(kind, self.dlpack_device[1])

    @property
    def torch_dtype(self):
        return _torch_dtype(self.dtype)

    @property
    def torch_file_dtype(self):
        return _torch_dtype(self.file_dtype)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.dlpack_device

    def __dlpack__(self, stream=None, **_):
        """A DLPack capsule of this shard (zero copy); the state lives until it is released.

        STREAM is the consumer's, as DLPack numbers it: for CUDA memory a cudaStream_t as an int,
        1 the legacy default stream, 2 the per-thread one, None (and -1, no synchronisation asked)
        the legacy default stream; host memory takes None only. The data is ready on any stream;
        what the consumer queues on STREAM before it releases the capsule finishes before the
        memory is freed (sl_state_export)."""
        from . import _dlpack
        if self._state is None or not self._state.ptr:
            raise ValueError(f"{self.name}: no live state owns this tensor")
        dt, did = self.dlpack_device
        if dt not in IMPORT_AS:
            raise ShardloadError(_capi.status_enum().ERR_UNSUPPORTED,
                                 f"tensor '{self.name}' lives in memory of DLPack device type "
                                 f"{device_type_name(dt)} (the sim backend's simulated device), which no "
                                 "framework can address; load with backend 'cpu' or a real accelerator backend")
        native = _dlpack.native_stream(self.name, dt, stream)
        return _dlpack.capsule(self._state, self._state.ptr, self._index, native, self.data_ptr, self.local_shape,
                               self.dtype, int(IMPORT_AS[dt]), did)

    def to_torch(self):
        """The local shard as a torch tensor viewing the loaded memory (no copy), lent for torch's
        current stream: kernels queued on it finish before the memory is freed."""
        if self.caller_buffer and self._state is not None and self.name in self._state.buffers:
            from ._torch import view_buffer
            return view_buffer(self._state.buffers[self.name], self)
        from ._torch import consumer_stream, from_capsule
        return from_capsule(self.__dlpack__(stream=consumer_stream(self.dlpack_device)), self.dtype)


class _Handle:
    """Owns the C state; referenced by the State and by every exported tensor (no cycle, so the
    memory goes as soon as the last of them does, not at the next garbage collection)."""

    __slots__ = ("ptr", "buffers", "__weakref__")

    def __init__(self, ptr, buffers):
        self.ptr, self.buffers = ptr, buffers

    def close(self):
        p, self.ptr = self.ptr, None
        self.buffers = {}
        if p:
            _capi.lib().sl_state_destroy(p)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class State:
    """The loaded shards of this rank (sl_state). Shards exported with to_torch() keep its memory
    alive; close() (or dropping the State) releases what no exported tensor views."""

    def __init__(self, ptr: c_void_p, buffers: dict):
        self._h = _Handle(ptr, buffers)
        lib = _capi.lib()
        self._tensors: dict[str, LoadedTensor] = {}
        for i in range(lib.sl_state_count(ptr)):
            t = LoadedTensor._from_c(lib.sl_state_tensor(ptr, i).contents, self._h, i)
            self._tensors[t.name] = t

    @property
    def _ptr(self):
        if self._h is None or not self._h.ptr:
            raise ValueError("shardload state is closed")
        return self._h.ptr

    def close(self) -> None:
        """Drops this State's reference; the memory goes once no exported tensor views it."""
        h, self._h = self._h, None
        self._tensors = {}
        del h

    def __len__(self):
        return len(self._tensors)

    def __iter__(self):
        return iter(self._tensors)

    def __getitem__(self, name: str) -> LoadedTensor:
        return self._tensors[name]

    def __contains__(self, name) -> bool:
        return name in self._tensors

    def items(self):
        return self._tensors.items()

    def keys(self):
        return self._tensors.keys()

    def values(self):
        return self._tensors.values()

    @property
    def skipped(self) -> list[str]:
        lib = _capi.lib()
        return [_capi.text(lib.sl_state_skipped_at(self._ptr, i)) for i in range(lib.sl_state_skipped_count(self._ptr))]

    def stats(self) -> dict:
        s = _capi.LoadStats()
        s.size = sizeof(s)
        _capi.lib().sl_state_stats(self._ptr, byref(s))
        return {f: getattr(s, f) for f, _ in s._fields_ if f != "size"}

    def to_torch(self) -> dict:
        """{name: local shard as a torch tensor} (zero copy)."""
        return {n: t.to_torch() for n, t in self._tensors.items()}
