"""Every ctypes Structure of the binding against the C layout, sizes and offsets taken from the
C side: a C program generated from the Python declarations (each struct's `_c_name_` and field
names) is compiled with the project's header and prints sizeof/offsetof of each struct and
field. A field only one side has fails the compile (named in Python, absent in C) or a size or
offset (in C, absent in Python); a field of another width or order fails an offset or size.
The DLPack structs are checked the same way against torch's dlpack.h where torch ships it.

C compiler: $SHARDLOAD_CC (CTest sets the build's), else $CC, else cc. Headers: the
directories in $SHARDLOAD_INCLUDE_DIRS (os.pathsep-separated: core/include and the build's generated
include/), else the source tree's core/include and build/cpu/include."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from ctypes import Structure, c_int, c_size_t

import pytest

from shardload import _capi, _dlpack

from conftest import REPO


def structs_of(module) -> list[type]:
    """Every Structure class a module declares (a new one cannot be left out of the check)."""
    return [v for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, Structure) and v.__module__ == module.__name__]


def c_program(structs, headers) -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>"] + [f"#include <{h}>" for h in headers]
    lines.append("int main(void) {")
    for cls in structs:
        t = cls._c_name_
        lines.append(f'  printf("{t} %zu\\n", sizeof({t}));')
        for name, *_ in cls._fields_:
            lines.append(f'  printf("{t}.{name} %zu %zu\\n", offsetof({t}, {name}), sizeof((({t} *)0)->{name}));')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def compiler() -> str:
    cc = os.environ.get("SHARDLOAD_CC") or os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) to take the layout from")
    return cc


def c_layout(structs, headers, include_dirs, tmp) -> dict[str, tuple[int, ...]]:
    """{"sl_tensor": (size,), "sl_tensor.name": (offset, size), ...} as the C compiler lays them out."""
    src = os.path.join(tmp, "layout.c")
    exe = os.path.join(tmp, "layout")
    with open(src, "w") as f:
        f.write(c_program(structs, headers))
    cmd = [compiler(), "-std=c11", "-o", exe, src] + [f"-I{d}" for d in include_dirs]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"the layout program does not compile (a field the header lacks?):\n{r.stderr}")
    out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    layout = {}
    for line in out.splitlines():
        key, *numbers = line.split()
        layout[key] = tuple(int(n) for n in numbers)
    return layout


def mismatches(structs, layout) -> list[str]:
    bad = []
    for cls in structs:
        t = cls._c_name_
        if layout[t][0] != ctypes.sizeof(cls):
            bad.append(f"{cls.__name__} ({t}): sizeof {ctypes.sizeof(cls)} in Python, {layout[t][0]} in C")
        for name, *_ in cls._fields_:
            d = getattr(cls, name)
            if layout[f"{t}.{name}"] != (d.offset, d.size):
                off, size = layout[f"{t}.{name}"]
                bad.append(f"{cls.__name__}.{name}: offset {d.offset} size {d.size} in Python, "
                           f"offset {off} size {size} in C")
    return bad


def shardload_includes() -> list[str]:
    env = os.environ.get("SHARDLOAD_INCLUDE_DIRS")
    dirs = env.split(os.pathsep) if env else [os.path.join(REPO, "core", "include"),
                                       os.path.join(REPO, "build", "cpu", "include")]
    if not os.path.isfile(os.path.join(dirs[-1], "shardload", "version.h")) and not env:
        pytest.skip("no configured build tree for shardload/version.h: set SHARDLOAD_INCLUDE_DIRS")
    return dirs


def test_every_structure_names_its_c_struct():
    for cls in structs_of(_capi) + structs_of(_dlpack):
        assert isinstance(getattr(cls, "_c_name_", None), str), f"{cls.__name__} has no _c_name_"


def test_capi_matches_header(tmp_path):
    structs = structs_of(_capi)
    assert len(structs) >= 11, [c.__name__ for c in structs]
    bad = mismatches(structs, c_layout(structs, ["shardload/shardload.h"], shardload_includes(), tmp_path))
    assert not bad, "the ctypes binding drifted from shardload.h:\n" + "\n".join(bad)


def test_dlpack_matches_torch_header(tmp_path):
    torch = pytest.importorskip("torch")
    inc = os.path.join(os.path.dirname(torch.__file__), "include")
    if not os.path.isfile(os.path.join(inc, "ATen", "dlpack.h")):
        pytest.skip("this torch ships no ATen/dlpack.h")
    structs = structs_of(_dlpack)
    bad = mismatches(structs, c_layout(structs, ["ATen/dlpack.h"], [inc], tmp_path))
    assert not bad, "the DLPack structs drifted from dlpack.h:\n" + "\n".join(bad)


def _variant(cls, fields):
    return type(cls.__name__, (Structure,), {"_c_name_": cls._c_name_, "_fields_": fields})


def test_a_deliberate_mismatch_fails(tmp_path):
    """The check can fail: a field dropped, two swapped, one narrowed, one the header lacks."""
    inc = shardload_includes()
    lo = _capi.LoadOptions._fields_
    dropped = _variant(_capi.LoadOptions, lo[:-1])  # progress_status missing: size differs
    swapped = _variant(_capi.LoadOptions, [lo[0], lo[2], lo[1]] + lo[3:])  # strategy before cpu_offload
    narrowed = _variant(_capi.ExportOptions, [(n, c_int if n == "errbuf_size" else t)
                                              for n, t in _capi.ExportOptions._fields_])
    layout = c_layout([dropped, swapped, narrowed], ["shardload/shardload.h"], inc, tmp_path)
    assert any("sizeof" in m for m in mismatches([dropped], layout)), "a dropped field went unseen"
    assert any(".cpu_offload: offset" in m for m in mismatches([swapped], layout)), "a swap went unseen"
    assert any(".errbuf_size" in m for m in mismatches([narrowed], layout)), "a narrowed field went unseen"
    invented = _variant(_capi.Binding, _capi.Binding._fields_ + [("no_such_field", c_size_t)])
    with pytest.raises(AssertionError, match="no_such_field"):
        c_layout([invented], ["shardload/shardload.h"], inc, tmp_path)
