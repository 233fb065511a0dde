"""torch's vocabulary in the API: Status from the library's own table, DLPack device kinds by
name, torch dtypes and devices in and out, one spelling with the command (the old ones
deprecated), process_group= checks (the multi-rank cases are in test_api.py)."""

from __future__ import annotations

import os
import re
import warnings

import pytest

import shardload
from shardload import _capi

PACKAGE = os.path.dirname(shardload.__file__)


# ---- Status ----------------------------------------------------------------------------------

def test_status_is_the_librarys_table():
    Status = shardload.Status
    lib = _capi.lib()
    assert Status.OK == 0 and isinstance(Status.ERR_BUFFER, int)
    for member in Status:
        assert member.c_name == "SL_" + member.name == _capi.text(lib.sl_status_name(member))
        assert member.message == _capi.text(lib.sl_strerror(member))
    # dense from 0 and complete: the code after the last is outside the library's table
    assert [int(m) for m in Status] == list(range(len(Status)))
    assert _capi.text(lib.sl_status_name(len(Status))) == "SL_ERR_UNKNOWN"
    assert Status.ERR_BUFFER.message == "caller buffer rejected"
    from shardload import Status as imported  # PEP 562: from-import works too
    assert imported is Status


def test_error_status_is_a_status(tmp_path):
    with shardload.Context(backend="cpu") as ctx:
        with pytest.raises(shardload.ShardloadError) as e:
            ctx.open(str(tmp_path / "absent.safetensors"))
    err = e.value
    assert isinstance(err.status, shardload.Status)
    assert err.status is shardload.Status.ERR_NOT_FOUND and err.status_name == err.status.c_name
    assert "absent.safetensors" in str(err)
    # a code outside the table (a newer library's) stays an int, named as the library names it
    odd = shardload.ShardloadError(len(shardload.Status) + 5, "from a newer library")
    assert type(odd.status) is int and odd.status_name == "SL_ERR_UNKNOWN"


OWN = ("__init__.py", "_capi.py", "_calls.py", "_convert.py", "_dlpack.py", "_group.py", "_placement.py", "_progress.py")


def test_no_status_literals_in_the_package():
    """Statuses are named (Status.ERR_BUFFER), never written as numbers."""
    pattern = re.compile(r"ShardloadError\(\s*\d|return\s+\d+\s*#\s*SL_ERR|status\s*==\s*\d")
    for name in OWN:
        with open(os.path.join(PACKAGE, name)) as f:
            for n, line in enumerate(f, 1):
                assert not pattern.search(line), f"{name}:{n}: a status as a number: {line.strip()}"


# ---- DLPack device kinds, torch dtypes and devices --------------------------------------------

def test_dlpack_device_names(checkpoint, torch):
    path, sd = checkpoint
    with shardload.Context(backend="cpu") as ctx:
        t = ctx.load(ctx.plan(), ctx.open(path))["a.weight"]
        kind, ordinal = t.dlpack_device
        assert kind == 1 and str(kind) == "cpu" and f"{kind}" == "cpu" and t.device_type == "cpu"
        assert t.__dlpack_device__() == (1, 0)  # still DLPack's ints for consumers
        assert t.torch_device == torch.device("cpu")
        assert t.to_torch().device == t.torch_device
    with shardload.Context(backend="sim") as ctx:
        st = ctx.load(ctx.plan(), ctx.open(path), cpu_offload=False)
        t = st["a.weight"]
        assert t.device_type == "ext_dev" and t.torch_device is None
        with pytest.raises(shardload.ShardloadError, match="ext_dev") as e:
            t.to_torch()
        assert e.value.status is shardload.Status.ERR_UNSUPPORTED
    DL = shardload.DLDeviceType
    assert (str(DL.CUDA), str(DL.CUDA_HOST), str(DL.ROCM), str(DL.ONEAPI)) == ("cuda", "cuda_host", "rocm", "oneapi")
    assert DL.of(999) == 999 and type(DL.of(999)) is int


def test_torch_dtypes_in_and_out(checkpoint, torch):
    path, sd = checkpoint
    with shardload.Context(backend="cpu") as ctx:
        src = ctx.open(path)
        assert src["a.bias"].torch_dtype is torch.bfloat16 and src["ids"].torch_dtype is torch.int64
        plan = ctx.plan(param_dtype=torch.bfloat16).add_rule("b.*", dtype=torch.float16)
        st = ctx.load(plan, src)
        w = st["a.weight"]
        assert (w.dtype, w.torch_dtype, w.torch_file_dtype) == ("BF16", torch.bfloat16, torch.float32)
        assert st["b.weight"].torch_dtype is torch.float16
        assert st["ids"].torch_dtype is torch.int64  # a cast applies to floating tensors only
        assert torch.equal(w.to_torch(), sd["a.weight"].to(torch.bfloat16))
        with pytest.raises(ValueError, match="complex64"):
            ctx.plan(param_dtype=torch.complex64)


def test_device_arguments(torch):
    for device in ("cpu", torch.device("cpu"), "cpu:0"):
        with shardload.Context(device=device) as ctx:
            assert ctx.backend == "cpu"
    with shardload.Context(device="sim:0") as ctx:
        assert ctx.backend == "sim" and ctx.device_description.startswith("sim:0")
    with shardload.Context(device=0, backend="sim") as ctx:  # an ordinal, as before
        assert ctx.backend == "sim"
    with pytest.raises(ValueError, match="backend 'cpu'.*'sim' given"):
        shardload.Context(device="cpu", backend="sim")
    with pytest.raises(ValueError, match="'cuda:x'"):
        shardload.Context(device="cuda:x")
    with pytest.raises(ValueError, match="'tpu:0'"):
        shardload.Context(device="tpu:0")
    with pytest.raises(TypeError, match="float"):
        shardload.Context(device=1.5)
    if not torch.cuda.is_available():  # the device type picks its backend: cuda, absent here
        with pytest.raises(shardload.ShardloadError, match="cuda"):
            shardload.Context(device=torch.device("cuda", 1))


def test_placement_results(torch):
    p = shardload.resolve_placement(True, None)
    assert p == ("cpu", "cpu_offload=on", False) and p.device == "cpu" and not p.pinned
    assert p.torch_device == torch.device("cpu")
    off = shardload.resolve_placement(False, "cpu-pinned")
    assert off.device == "device"
    assert off.torch_device.type == (torch.accelerator.current_accelerator().type
                                     if torch.accelerator.is_available() else "cpu")


# ---- one spelling with the command --------------------------------------------------------------

def test_new_spellings_are_silent(checkpoint):
    path, _ = checkpoint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shardload.resolve_placement(None, "cpu-pinned") == ("cpu", "inferred: CPU offload policy", True)
        with shardload.Context(backend="cpu") as ctx:
            ctx.plan(offload_policy="cpu-pinned")
            st = ctx.load(ctx.plan(), ctx.open(path), read_mode="every-rank")
            assert len(st) == 6


def test_old_spellings_warn_and_still_work(checkpoint):
    path, _ = checkpoint
    with pytest.warns(DeprecationWarning, match="'cpu\\+pin' is deprecated.*'cpu-pinned'") as w:
        assert shardload.resolve_placement(None, "cpu+pin") == ("cpu", "inferred: CPU offload policy", True)
    assert w[0].filename == __file__  # attributed to the caller, not to the package
    with shardload.Context(backend="cpu") as ctx:
        with pytest.warns(DeprecationWarning, match="cpu-pinned") as w:
            plan = ctx.plan(offload_policy="cpu+pin")
        assert w[0].filename == __file__
        with pytest.warns(DeprecationWarning, match="'every_rank' is deprecated.*'every-rank'"):
            st = ctx.load(plan, ctx.open(path), read_mode="every_rank")
        assert st["a.weight"].device == "cpu" and st["a.weight"].rule == "inferred: CPU offload policy"
    with pytest.raises(ValueError, match="'cpu-pinned'"):
        shardload.resolve_placement(None, "pinned")


# ---- process_group= (single-process checks; the ranks of real groups in test_api.py) -------

def test_process_group_arguments(torch):
    import torch.distributed as dist
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="not initialised"):
        shardload.Context(process_group=object())
    with pytest.raises(ValueError, match="without world_size"):
        shardload.Context(process_group=object(), world_size=1, rank=0)


def test_process_groups_meet_under_their_own_keys(tmp_path):
    """Two groups over one store never share rendezvous keys, and each numbers its contexts
    from 0 (in a fresh process: torch.distributed's state is per process)."""
    code = f"""
import torch.distributed as dist, shardload
from shardload._group import process_group_rendezvous as rdzv
dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
g1, g2 = dist.new_group([0]), dist.new_group([0])
keys = [rdzv(None)[4], rdzv(g1)[4], rdzv(g1)[4], rdzv(g2)[4], rdzv(dist.group.WORLD)[4]]
assert keys[0] == "torch-pg:0" and keys[4] == "torch-pg:1", keys  # the default group's, as before
assert keys[1].endswith(":0") and keys[2].endswith(":1") and keys[1][:-2] == keys[2][:-2], keys
assert len({{k[:-2] for k in keys[1:4]}}) == 2 and keys[3].endswith(":0"), keys
with shardload.Context(process_group=g2) as ctx:
    assert (ctx.rank, ctx.world_size) == (0, 1)
dist.destroy_process_group()
print("ok")
"""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
