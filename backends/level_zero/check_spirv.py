#!/usr/bin/env python3
"""test_ze_spirv: the Level Zero backend's SPIR-V modules, read with spirv-dis.

For each module (the base one and the F64 one):
  - its entry points are exactly the kernels ze_kernels.h gives that module (the list comes from
    the host build of the same source: `test_ze_kernels --names base|f64`), each a Kernel;
  - no fused multiply-add: no OpenCL.std fma/mad ext-inst, no OpFmaKHR, no fmuladd import: the
    host's SGD step rounds the product and the difference separately;
  - every entry point has ExecutionMode ContractionOff, so the device compiler may not fuse the
    separate OpFMul/OpFSub either;
  - the base module declares no Float64 and has no 64-bit float type (it must build on a GPU
    without fp64); the F64 module declares Float64 (or it is not what it says).
With --expect-fma-base/--expect-fma-f64 MUTANT (the same modules built with OpenCL's default
contraction), each MUTANT must show a fused multiply-add in an SGD kernel and an SGD entry
point without ContractionOff: the checks above can fail.

  check_spirv.py --dis spirv-dis --names test_ze_kernels --base B.spv --f64 F.spv
                 [--expect-fma-base MB.spv --expect-fma-f64 MF.spv]
"""
import argparse
import re
import subprocess
import sys

ENTRY = re.compile(r'^\s*OpEntryPoint\s+(\w+)\s+(%\S+)\s+"([^"]+)"')
MODE = re.compile(r"^\s*OpExecutionMode\s+(%\S+)\s+(\w+)")
FUNC = re.compile(r"^\s*(%\S+)\s*=\s*OpFunction\b")
FUNC_END = re.compile(r"^\s*OpFunctionEnd\b")
FMA = re.compile(r"OpExtInst\s+%\S+\s+%\S+\s+(?:fma|mad)\b|\bOpFmaKHR\b|fmuladd")


def disassemble(dis, path):
    r = subprocess.run([dis, "--no-color", "--no-header", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{path}: spirv-dis failed: {r.stderr.strip()}")
    return r.stdout.splitlines()


def read(dis, path):
    """Entry points {name: (model, id)}, their execution modes {id: set}, the FMA lines of each
    function {id: [line]}, and the whole text."""
    lines = disassemble(dis, path)
    entries, modes, fmas, func = {}, {}, {}, None
    for line in lines:
        if m := ENTRY.match(line):
            entries[m.group(3)] = (m.group(1), m.group(2))
        elif m := MODE.match(line):
            modes.setdefault(m.group(1), set()).add(m.group(2))
        elif m := FUNC.match(line):
            func = m.group(1)
        elif FUNC_END.match(line):
            func = None
        elif FMA.search(line):
            fmas.setdefault(func, []).append(line.strip())
    return entries, modes, fmas, lines


def names_of(names_cmd, module):
    r = subprocess.run([names_cmd, "--names", module], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.split():
        sys.exit(f"{names_cmd} --names {module}: failed or listed nothing: {r.stderr.strip()}")
    return r.stdout.split()


def check(dis, path, module, want):
    failures = []
    entries, modes, fmas, lines = read(dis, path)
    missing = sorted(set(want) - set(entries))
    extra = sorted(set(entries) - set(want))
    if missing:
        failures.append(f"{path}: kernels ze_kernels.h gives the {module} module are not in it: {', '.join(missing)}")
    if extra:
        failures.append(f"{path}: entry points ze_kernels.h does not name: {', '.join(extra)}")
    for name, (model, fid) in sorted(entries.items()):
        if model != "Kernel":
            failures.append(f"{path}: {name} is a {model} entry point, not a Kernel")
        if "ContractionOff" not in modes.get(fid, set()):
            failures.append(f"{path}: {name} has no ContractionOff: the device compiler may fuse its multiply-adds")
    for fid, found in sorted(fmas.items(), key=lambda kv: str(kv[0])):
        failures.append(f"{path}: a fused multiply-add (in function {fid}): {found[0]}")
    text = "\n".join(lines)
    has_f64 = re.search(r"^\s*OpCapability\s+Float64\b", text, re.M) or re.search(r"OpTypeFloat\s+64\b", text)
    if module == "base" and has_f64:
        failures.append(f"{path}: the base module uses 64-bit floats: it would not build on a GPU without fp64")
    if module == "f64" and not has_f64:
        failures.append(f"{path}: the F64 module declares no Float64")
    return failures, entries, modes, fmas


def check_mutant(dis, path, module):
    """The contracting build must trip both the FMA and the ContractionOff checks."""
    _, entries, modes, fmas = check(dis, path, module, [])
    failures = []
    sgd = {fid for name, (_, fid) in entries.items() if name.startswith("sl_sgd_")}
    if not fmas:
        failures.append(f"{path}: the contracting build shows no fused multiply-add: the FMA check cannot fail")
    if all("ContractionOff" in modes.get(fid, set()) for fid in sgd):
        failures.append(f"{path}: the contracting build's SGD kernels are all ContractionOff: that check cannot fail")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dis", required=True)
    ap.add_argument("--names", required=True, help="test_ze_kernels (prints a module's kernel names)")
    ap.add_argument("--base", required=True)
    ap.add_argument("--f64", required=True)
    ap.add_argument("--expect-fma-base")
    ap.add_argument("--expect-fma-f64")
    a = ap.parse_args()
    failures = []
    for module, path in (("base", a.base), ("f64", a.f64)):
        want = names_of(a.names, module)
        found, entries, _, _ = check(a.dis, path, module, want)
        failures += found
        print(f"{path}: {len(entries)} kernels ({module}), ContractionOff, no fused multiply-add")
    for module, path in (("base", a.expect_fma_base), ("f64", a.expect_fma_f64)):
        if path:
            failures += check_mutant(a.dis, path, module)
    for f in failures:
        print(f"FAIL: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
