#!/usr/bin/env python3
"""Cross-check shardload's host dtype conversions against torch.Tensor.to, bit for bit.

For every pair of castable dtypes (F64, F32, F16, BF16) it converts the same bit patterns
with torch and with sl_convert from libshardload (through ctypes) and compares the bits:
all 2^16 patterns of the 16-bit types, random F32/F64 patterns, values near the F16/BF16
ranges, and F64 values built to expose double rounding. --exhaustive adds every one of the
2^32 F32 patterns for F32 -> F16 and F32 -> BF16 (a few minutes).

    python3 tools/crosscheck_dtype.py [--lib build/libshardload.so] [--exhaustive]

Exit status 0 when every bit matches, 1 on a mismatch, 2 when torch or the library is absent.
Notes: torch's own NaN bits differ between its kernels (F64 -> BF16 writes 0xFFFF from its
vector loop and 0x7FC0 from its scalar tail), so arrays are padded to a multiple of 64
elements to stay on the vector path, which shardload matches.
"""
import argparse
import ctypes
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"crosscheck_dtype: needs numpy and torch ({e})", file=sys.stderr)
    sys.exit(2)

SL = {"F64": 1, "F32": 2, "F16": 3, "BF16": 4}
TORCH = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
UINT = {"F64": np.uint64, "F32": np.uint32, "F16": np.uint16, "BF16": np.uint16}
SINT = {8: torch.int64, 4: torch.int32, 2: torch.int16}
NP_SINT = {8: np.int64, 4: np.int32, 2: np.int16}
SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.sl_convert.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    lib.sl_convert.restype = ctypes.c_int
    return lib


def pad64(bits):
    n = (-len(bits)) % 64
    return np.concatenate([bits, bits[:n]]) if n else bits


def with_torch(bits, src, dst):
    size = SIZE[src]
    t = torch.from_numpy(bits.view(NP_SINT[size]).copy()).view(TORCH[src])
    out = t.to(TORCH[dst]).view(SINT[SIZE[dst]]).numpy()
    return out.view(UINT[dst])


def with_lib(lib, bits, src, dst):
    out = np.empty(len(bits), dtype=UINT[dst])
    rc = lib.sl_convert(out.ctypes.data, SL[dst], bits.ctypes.data, SL[src], len(bits))
    if rc != 0:
        raise RuntimeError(f"sl_convert {src}->{dst} returned {rc}")
    return out


def inputs(src, rng):
    if SIZE[src] == 2:
        return np.arange(1 << 16, dtype=np.uint16)
    if src == "F32":
        rand = rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)
        near = rand.copy()
        near[:] = (near & np.uint32(0x807FFFFF)) | (
            rng.integers(96, 152, size=len(near), dtype=np.uint32) << np.uint32(23))
        edges = []
        for e in range(256):
            for m in (0, 1, 0x1000, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x18000, 0x7FFFFF, 0x400000):
                edges += [(e << 23) | m, 0x80000000 | (e << 23) | m]
        return np.concatenate([rand, near, np.array(edges, dtype=np.uint32)])
    rand = rng.integers(0, 1 << 63, size=1 << 19, dtype=np.uint64) | (
        rng.integers(0, 2, size=1 << 19, dtype=np.uint64) << np.uint64(63))
    near = (rand & np.uint64(0x800FFFFFFFFFFFFF)) | (
        rng.integers(1023 - 150, 1023 + 130, size=len(rand), dtype=np.uint64) << np.uint64(52))
    # F32/F16/BF16 ties nudged by a bit F32 can no longer see: torch rounds through F32 twice
    f32 = rng.integers(0, 1 << 32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    f32 = (f32 & np.uint32(0x807FFFFF)) | (rng.integers(100, 150, size=len(f32), dtype=np.uint32) << np.uint32(23))
    base = f32.view(np.float32).astype(np.float64).view(np.uint64)
    ties = []
    for shift in (13, 16):  # F16 and BF16 tie bits, as seen in the F64 mantissa (29 more bits)
        tie = (base & ~np.uint64((1 << (shift + 29)) - 1)) | np.uint64(1 << (shift + 28))
        ties += [tie, tie + np.uint64(1), tie - np.uint64(1)]
    return np.concatenate([rand, near] + ties)


def compare(name, ref, got, src_bits):
    bad = np.nonzero(ref != got)[0]
    if len(bad) == 0:
        return 0
    shown = ", ".join(f"{int(src_bits[i]):#x}: torch {int(ref[i]):#x} shardload {int(got[i]):#x}" for i in bad[:5])
    print(f"  {name}: {len(bad)} of {len(ref)} differ ({shown})")
    return len(bad)


def exhaustive(lib, dst):
    bad = 0
    step = 1 << 24
    for start in range(0, 1 << 32, step):
        bits = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
        bad += compare(f"F32->{dst} [{start:#x}..]", with_torch(bits, "F32", dst), with_lib(lib, bits, "F32", dst), bits)
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=os.environ.get("SHARDLOAD_LIB", os.path.join(here, "..", "build", "libshardload.so")))
    ap.add_argument("--exhaustive", action="store_true", help="all 2^32 F32 patterns to F16 and BF16")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        lib = load_lib(a.lib)
    except OSError as e:
        print(f"crosscheck_dtype: cannot load {a.lib}: {e}; build it or pass --lib", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__} (cpu capability {torch.backends.cpu.get_cpu_capability()}), library {a.lib}")
    rng = np.random.default_rng(a.seed)
    total = 0
    for src in SL:
        bits = pad64(inputs(src, rng))
        for dst in SL:
            if src == dst:
                continue
            n = compare(f"{src}->{dst}", with_torch(bits, src, dst), with_lib(lib, bits, src, dst), bits)
            print(f"{src:>4} -> {dst:<4} {len(bits):>8} values: {'ok' if n == 0 else f'{n} MISMATCHES'}")
            total += n
    if a.exhaustive:
        for dst in ("F16", "BF16"):
            n = exhaustive(lib, dst)
            print(f" F32 -> {dst:<4} all 2^32 patterns: {'ok' if n == 0 else f'{n} MISMATCHES'}")
            total += n
    print("all bits match torch" if total == 0 else f"{total} mismatches")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
