"""Inside a torch job the NCCL module uses the NCCL torch loaded, not a copy of its own.

    python python/tests/test_nccl_torch.py [--decoy LIBNCCL]  # SHARDLOAD_LIBRARY: a build with libshardload-nccl.so

A CUDA build of torch maps the nvidia-nccl wheel's libnccl.so.2 at `import torch`, GPU or not.
Two NCCLs in one process (torch's and the module's) would each start their own threads and keep
their own communicators; the module must get torch's. In a child process that imports torch,
with a decoy NCCL on the loader's path and in $SHARDLOAD_NCCL_LIBRARY (--decoy: CTest passes the
build's fake libnccl.so.2; else the CUDA toolkit's copy),
the module list (sl_module_list_create, what `shardload backends` prints) probes the nccl
collective with "cuda": the probe opens NCCL before it asks for a driver (collectives/nccl/
nccl.c), so it runs without a GPU. Then /proc/self/maps must hold exactly one libnccl, torch's.
A control child that does not import torch must map the decoy: the probe really opened NCCL.
Exit 77 (skipped) where torch is missing or has no NCCL of its own (a CPU build of torch), or no
other NCCL is on this machine to be the decoy; with SHARDLOAD_REQUIRE_TORCH=1 (CI: PyPI's torch,
a CUDA build) those fail instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from ctypes import POINTER, Structure, byref, c_char_p, c_int, c_size_t, c_uint, c_uint32, c_uint64, c_void_p

DECOYS = ("/usr/local/cuda/lib64/libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2")


class ModuleInfo(Structure):  # sl_module_info (shardload.h)
    _fields_ = [("size", c_size_t), ("kind", c_int), ("state", c_int), ("name", c_char_p), ("builtin", c_int),
                ("path", c_char_p), ("abi_version", c_uint), ("probe", c_int), ("reason", c_char_p),
                ("device", c_char_p), ("memory_bytes", c_uint64), ("pairs_with", c_char_p), ("domains", c_uint32),
                ("probed_with", c_char_p), ("device_count", c_size_t), ("devices", c_void_p),
                ("devices_not_listed", c_size_t)]


def nccls_mapped() -> list[str]:
    """The distinct files named libnccl* mapped into this process, by their real paths."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        files = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return sorted({os.path.realpath(p) for p in files if os.path.basename(p).startswith("libnccl")})


def child(with_torch: bool) -> None:
    """Probe the modules; print the nccl collective's entry and the NCCLs mapped, as JSON."""
    before: list[str] = []
    if with_torch:
        import torch  # noqa: F401  (maps torch's NCCL)
        before = nccls_mapped()
    import shardload
    from shardload import _capi
    lib = _capi.lib()
    lib.sl_module_list_create.argtypes = [c_void_p, POINTER(c_void_p)]
    lib.sl_module_list_count.argtypes = [c_void_p]
    lib.sl_module_list_count.restype = c_size_t
    lib.sl_module_list_get.argtypes = [c_void_p, c_size_t, POINTER(ModuleInfo)]
    lib.sl_module_list_destroy.argtypes = [c_void_p]
    lst = c_void_p()
    assert lib.sl_module_list_create(None, byref(lst)) == 0, "sl_module_list_create failed"
    entry = None
    for i in range(lib.sl_module_list_count(lst)):
        m = ModuleInfo(size=ctypes.sizeof(ModuleInfo))
        assert lib.sl_module_list_get(lst, i, byref(m)) == 0
        if m.kind == 2 and m.name == b"nccl":
            entry = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in
                     (("state", m.state), ("path", m.path), ("reason", m.reason), ("probed_with", m.probed_with))}
    lib.sl_module_list_destroy(lst)
    print(json.dumps({"library": shardload.library_path(), "before": before, "after": nccls_mapped(),
                      "nccl": entry, "env": os.environ.get("SHARDLOAD_NCCL_LIBRARY")}))


def run_child(with_torch: bool, decoy: str) -> dict:
    env = dict(os.environ, SHARDLOAD_NCCL_LIBRARY=decoy,
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [os.path.dirname(decoy), os.environ.get("LD_LIBRARY_PATH")])))
    r = subprocess.run([sys.executable, __file__, "--child", "torch" if with_torch else "plain"], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: the {'torch' if with_torch else 'control'} child exited {r.returncode}: "
                         f"{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def fail(what: str) -> None:
    print(f"FAIL: {what}")
    sys.exit(1)


def skip(why: str) -> int:
    if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1":
        print(f"FAIL (SHARDLOAD_REQUIRE_TORCH=1): {why}")
        return 1
    print(f"skipped: {why}")
    return 77


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2] == "torch")
        return 0
    given = sys.argv[2:3] if len(sys.argv) == 3 and sys.argv[1] == "--decoy" else []
    try:
        import torch  # noqa: F401
    except ImportError as e:
        return skip(f"torch is not importable ({e})")
    torch_nccl = nccls_mapped()
    if len(torch_nccl) != 1:
        return skip(f"this torch ({torch.__version__}) maps {torch_nccl or 'no NCCL'} at import, not one of its own")
    decoys = [d for d in [*given, *DECOYS] if os.path.isfile(d) and os.path.realpath(d) != torch_nccl[0]]
    if not decoys:
        return skip(f"no NCCL on this machine but torch's ({torch_nccl[0]}) to be the decoy; looked at {given + list(DECOYS)}")
    decoy = os.path.realpath(decoys[0])
    print(f"torch {torch.__version__}: {torch_nccl[0]}; the decoy (loader path, $SHARDLOAD_NCCL_LIBRARY): {decoy}")

    ctl = run_child(False, decoy)
    print(f"control, no torch: {ctl}")
    if not ctl["nccl"] or not ctl["nccl"]["path"] or "libshardload-nccl" not in ctl["nccl"]["path"]:
        fail(f"the nccl module was not loaded from {ctl['library']}'s build: {ctl['nccl']}")
    if ctl["after"] != [decoy]:
        fail(f"without torch the probe should open the decoy {decoy} (the loader's search), mapped: {ctl['after']}")

    got = run_child(True, decoy)
    print(f"with torch: {got}")
    if got["before"] != torch_nccl:
        fail(f"import torch in the child mapped {got['before']}, not {torch_nccl}")
    if got["after"] != torch_nccl:
        fail(f"after the nccl module's probe the process maps {got['after']}: the module opened an NCCL of its own "
             f"beside torch's {torch_nccl[0]}")
    if "not found" in (got["nccl"]["reason"] or ""):
        fail(f"the module did not find torch's NCCL: {got['nccl']['reason']}")
    print(f"ok: one NCCL, torch's ({torch_nccl[0]}); the module's probe says: {got['nccl']['reason'] or 'runs'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
