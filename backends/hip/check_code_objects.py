#!/usr/bin/env python3
"""The HIP kernels' code objects, checked for what keeps them bit-exact with the host:

  - no fused or unfused floating multiply-add (v_fma*, v_fmac*, v_mad*_f*, v_mac*, v_pk_fma*,
    v_fmaak/v_fmamk, v_dot*) in the SGD and cast kernels: the host's step rounds the product and
    the difference separately (core/src/hostops.c), and a default HIP build (-ffp-contract=
    fast-honor-pragmas) contracts x - lr * g into one FMA;
  - subnormals kept, not flushed, in F32 and in F16/F64 (the kernel descriptor's
    FLOAT_DENORM_MODE fields): the F16 conversions round subnormals through the FPU.

Each code object (one per target) is taken out of the fat object's .hip_fatbin section with
clang-offload-bundler and disassembled with llvm-objdump. With --expect-fma OBJ, OBJ (the same
kernels built with contraction on) must show FMAs in the SGD kernels: the check can fail.

  check_code_objects.py --objdump P --bundler P --targets "gfx90a;gfx942" OBJ [--expect-fma OBJ]
Exit 0 when every check holds; 1 with one line per finding otherwise."""
import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

KERNELS = re.compile(r"(sgd_f64|sgd_f32|sgd_half|cast_kernel)")
# floating multiply-adds only: the integer v_mad_u64_u32 / v_mad_u32_u24 of index arithmetic are fine
FMA = re.compile(r"\bv_(?:pk_)?(?:fma|fmac|mad|mac|fmaak|fmamk|madak|madmk)(?:_mix\w*|_legacy\w*|_f16|_f32|_f64|_dx9\w*)\b"
                 r"|\bv_dot\d\w*\b")


def section(elf, name):
    """The bytes of section NAME of a 64-bit little-endian ELF file, and its address."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    for h in headers:
        end = elf.index(b"\0", strtab[4] + h[0])
        if elf[strtab[4] + h[0]:end].decode() == name:
            return elf[h[4]:h[4] + h[5]], h[3], headers
    return None, 0, headers


def symbols(elf, headers):
    """name -> (value, size) of the ELF's .symtab."""
    out = {}
    for h in headers:
        if h[1] != 2:  # SHT_SYMTAB
            continue
        strtab = headers[h[6]]
        for off in range(h[4], h[4] + h[5], 24):
            st_name, _info, _other, _shndx, value, size = struct.unpack_from("<IBBHQQ", elf, off)
            end = elf.index(b"\0", strtab[4] + st_name)
            out[elf[strtab[4] + st_name:end].decode()] = (value, size)
    return out


def code_objects(obj, bundler, targets, tmp):
    """target -> path of its code object, unbundled from OBJ's .hip_fatbin."""
    data = open(obj, "rb").read()
    fatbin, _, _ = section(data, ".hip_fatbin")
    if fatbin is None:
        sys.exit(f"{obj}: no .hip_fatbin section: not an object of hipcc -x hip")
    bundle = os.path.join(tmp, os.path.basename(obj) + ".fatbin")
    with open(bundle, "wb") as f:
        f.write(fatbin)
    listed = subprocess.run([bundler, "--list", "--type=o", "--input=" + bundle], capture_output=True, text=True,
                            check=True).stdout.split()
    out = {}
    for t in targets:
        ids = [b for b in listed if b.startswith("hip") and (b.endswith("--" + t) or ("--" + t + ":") in b)]
        if not ids:
            sys.exit(f"{obj}: no code object for {t} (bundles: {' '.join(listed)})")
        path = os.path.join(tmp, f"{os.path.basename(obj)}.{t}.co")
        subprocess.run([bundler, "--unbundle", "--type=o", "--input=" + bundle, "--targets=" + ids[0],
                        "--output=" + path], check=True)
        out[t] = path
    return out


def fma_lines(objdump, co):
    """(kernel, instruction) for every floating multiply-add in the checked kernels of CO."""
    text = subprocess.run([objdump, "-d", "--demangle", co], capture_output=True, text=True, check=True).stdout
    found, kernel, seen = [], None, set()
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            kernel = m.group(1) if KERNELS.search(m.group(1)) else None
            if kernel:
                seen.add(kernel)
            continue
        if kernel and FMA.search(line):
            found.append((kernel, line.strip()))
    return found, seen


def flushed_kernels(co):
    """Kernels whose descriptor flushes subnormals (FLOAT_DENORM_MODE_32 or _16_64 not 3), and
    how many descriptors were read."""
    elf = open(co, "rb").read()
    _, _, headers = section(elf, ".text")
    bad, read = [], 0
    for name, (value, size) in symbols(elf, headers).items():
        if not name.endswith(".kd") or size != 64 or not KERNELS.search(name):
            continue
        # the descriptor's file offset: its section's offset plus its place in it
        for h in headers:
            if h[3] <= value < h[3] + h[5] and h[1] == 1:
                rsrc1, = struct.unpack_from("<I", elf, h[4] + value - h[3] + 48)
                read += 1
                f32, f16_64 = (rsrc1 >> 16) & 3, (rsrc1 >> 18) & 3
                if f32 != 3 or f16_64 != 3:
                    bad.append(f"{name}: FLOAT_DENORM_MODE_32={f32}, FLOAT_DENORM_MODE_16_64={f16_64} (3 keeps them)")
    return bad, read


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--objdump", required=True)
    ap.add_argument("--bundler", required=True)
    ap.add_argument("--targets", required=True, help="the build's SHARDLOAD_HIP_ARCHS, ';'-separated")
    ap.add_argument("--expect-fma", help="the kernels built with contraction on")
    ap.add_argument("object")
    a = ap.parse_args()
    targets = [t.split(":")[0] for t in a.targets.split(";") if t]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for t, co in code_objects(a.object, a.bundler, targets, tmp).items():
            found, seen = fma_lines(a.objdump, co)
            if not any("sgd" in k for k in seen) or not any("cast_kernel" in k for k in seen):
                failures.append(f"{t}: the SGD and cast kernels were not found in the code object (seen: {sorted(seen)})")
            for kernel, insn in found:
                failures.append(f"{t}: {kernel}: a floating multiply-add: {insn} (build with -ffp-contract=off)")
            flushed, read = flushed_kernels(co)
            if read != len(seen):
                failures.append(f"{t}: {read} kernel descriptors read for {len(seen)} kernels")
            failures += [f"{t}: {b}: subnormals flushed (never build with -fgpu-flush-denormals-to-zero)" for b in flushed]
            print(f"{t}: {len(seen)} kernels checked: {len(found)} floating multiply-adds, {len(flushed)} flush "
                  "subnormals")
        if a.expect_fma:
            for t, co in code_objects(a.expect_fma, a.bundler, targets, tmp).items():
                found, _ = fma_lines(a.objdump, co)
                sgd = [k for k, _ in found if "sgd" in k]
                print(f"{t}: with contraction on: {len(found)} floating multiply-adds, in {sorted(set(sgd))}")
                if not sgd:
                    failures.append(f"{t}: the contracted build has no FMA in the SGD kernels: this check cannot fail")
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
