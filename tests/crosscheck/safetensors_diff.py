#!/usr/bin/env python3
"""Differential check of shardload's safetensors header validation against the reference
implementation, the `safetensors` package (it wraps the Rust crate).

A few thousand files are generated from a fixed seed: valid ones written by
safetensors.torch.save_file and safetensors.numpy.save_file, valid hand-built layouts (any JSON
order, padding, zero-length tensors anywhere legal), and invalid ones made by structured
mutations of valid headers and bodies (header length field, truncations, duplicate keys, wrong
types, bad numbers, offsets, holes, overlaps, missing and extra fields, metadata, UTF-8,
whitespace, dims, overflow), alone and in random pairs. Each file is judged twice:

  reference  safetensors.safe_open(path, 'pt' or 'np') opens it and every tensor reads
  shardload  `shardload inspect PATH --json` exits 0 (accept) or 1 (reject)

A case passes when both agree; on acceptance the tensor names, dtypes, shapes, byte counts,
absolute byte offsets (the bytes at shardload's offset equal the bytes the reference read) and
the metadata must agree too. A disagreement passes only when it is a known, reviewed class:

  documented  shardload rejects dtypes it does not know and tensors with more than 8 dims
              (SL_ERR_DTYPE / SL_ERR_UNSUPPORTED); it accepts leading whitespace before the
              header JSON (safetensors 0.8.0 accepts it too, so that is no divergence today)
  stricter    shardload rejects what the reference lets through: duplicate JSON keys (the
              reference keeps the last), unknown keys in a tensor entry (the reference ignores
              them), "__metadata__": null (the reference reads no metadata), \\u0000 in names
              and metadata (C strings cannot hold it), a tensor entry written as a JSON array
              [dtype, shape, data_offsets] (serde's sequence form of a struct), an integer of
              2^63 or more anywhere (jansson's integers are signed 64-bit; the reference reads
              u64, and such a value can only be valid where it is ignored or overwritten, or
              in the shape of an empty tensor, which the reference's frameworks cannot build)

A file whose header the crate accepts but whose tensor its framework cannot build (a shape entry
of 2^63 or more beside a 0; the FNUZ float8 dtypes under torch) counts as rejected; such cases
are listed as notes. Every other disagreement fails, above all shardload accepting a file the
reference rejects.
A few sharded checkpoints (model.safetensors.index.json) check that the index path validates
its shards the same way. Exits 77 when safetensors is not importable.

    python3 tests/crosscheck/safetensors_diff.py --bin build/shardload --tmp /tmp/stdiff
"""
import argparse
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

try:
    import numpy as np
    from safetensors import safe_open
    import safetensors.numpy as st_numpy
except Exception as e:  # pragma: no cover - environment without the reference
    print(f"skipped: safetensors not importable ({e})")
    # CI and scripts/test.sh install the reference packages: missing there is a failure
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)
try:
    import torch
    import safetensors.torch as st_torch
except Exception:  # torch is optional: without it only numpy dtypes are judged
    torch = None

SEED = 20240611
MAX_HEADER = 100_000_000
SL_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
             "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}
# dtypes the reference knows and shardload does not (size in bits)
REF_ONLY_DTYPES = {"C64": 64, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4,
                   "F6_E2M3": 6, "F6_E3M2": 6}
NUMPY_DTYPES = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL", "U16", "U32", "U64", "C64"}
SL_MAX_DIMS = 8


# ---- JSON text with full control: duplicates, raw tokens, invalid UTF-8 -------------------

class Obj:
    """A JSON object as ordered (key, value) pairs; duplicates allowed, keys may be Raw."""

    def __init__(self, pairs=()):
        self.pairs = [list(p) for p in pairs]

    def get(self, k, default=None):
        for kk, v in self.pairs:
            if kk == k:
                return v
        return default

    def set(self, k, v):
        for p in self.pairs:
            if p[0] == k:
                p[1] = v
                return
        self.pairs.append([k, v])

    def remove(self, k):
        self.pairs = [p for p in self.pairs if p[0] != k]

    def keys(self):
        return [p[0] for p in self.pairs]

    def copy(self):
        return Obj((k, deep(v)) for k, v in self.pairs)


class Raw:
    """Bytes written into the JSON text as they are."""

    def __init__(self, b):
        self.b = b if isinstance(b, bytes) else b.encode()

    def __eq__(self, o):
        return isinstance(o, Raw) and o.b == self.b

    def __hash__(self):
        return hash(self.b)


def deep(v):
    if isinstance(v, Obj):
        return v.copy()
    if isinstance(v, list):
        return [deep(x) for x in v]
    return v


def emit(v):
    if isinstance(v, Raw):
        return v.b
    if isinstance(v, Obj):
        return b"{" + b",".join(emit(k) + b":" + emit(x) for k, x in v.pairs) + b"}"
    if isinstance(v, list):
        return b"[" + b",".join(emit(x) for x in v) + b"]"
    return json.dumps(v, ensure_ascii=False).encode()


def le64(n):
    return struct.pack("<Q", n & 0xFFFFFFFFFFFFFFFF)


class Model:
    """A safetensors file as header value + padding + data, rebuilt on demand."""

    def __init__(self, header, data, lead=b"", trail=b""):
        self.header, self.data, self.lead, self.trail = header, data, lead, trail

    def copy(self):
        return Model(deep(self.header), self.data, self.lead, self.trail)

    def header_bytes(self):
        return self.lead + emit(self.header) + self.trail

    def build(self):
        h = self.header_bytes()
        return le64(len(h)) + h + self.data

    def tensors(self):
        """(name, entry) of the tensor entries that are objects."""
        if not isinstance(self.header, Obj):
            return []
        return [(k, v) for k, v in self.header.pairs if k != "__metadata__" and isinstance(v, Obj)]


def parse_file(b):
    """A file written by the package into a Model (the padding kept as trailing bytes)."""
    n = struct.unpack("<Q", b[:8])[0]
    text = b[8:8 + n]
    body = text.rstrip(b" ")
    header = json.loads(body, object_pairs_hook=Obj)
    # the writer emits metadata in Rust HashMap order, which changes from run to run: sort it
    # so the mutations that follow are the same every run
    meta = header.get("__metadata__")
    if isinstance(meta, Obj):
        meta.pairs.sort()
    return Model(header, b[8 + n:], b"", text[len(body):])


# ---- valid files ----------------------------------------------------------------------------

TORCH_DTYPES = None
if torch is not None:
    TORCH_DTYPES = [
        (torch.float32, "F32"), (torch.float16, "F16"), (torch.bfloat16, "BF16"), (torch.float64, "F64"),
        (torch.int8, "I8"), (torch.int16, "I16"), (torch.int32, "I32"), (torch.int64, "I64"),
        (torch.uint8, "U8"), (torch.bool, "BOOL"), (torch.float8_e4m3fn, "F8_E4M3"),
        (torch.float8_e5m2, "F8_E5M2"), (torch.uint16, "U16"), (torch.uint32, "U32"), (torch.uint64, "U64"),
    ]
NUMPY_GEN_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8,
                    np.uint16, np.uint32, np.uint64, np.bool_]

NAME_PARTS = ["model", "layers", "0", "1", "17", "self_attn", "q_proj", "weight", "bias", "norm", "embed",
              "\u00e9t\u00e9", "\u6a21\u578b", "\U0001F600", "a b", 'quo"te', "back\\slash", "tab\tname",
              "slash/x", "__metadata__x", "x" * 40]


def rand_name(rng, taken):
    while True:
        k = rng.randint(1, 4)
        name = ".".join(rng.choice(NAME_PARTS) for _ in range(k))
        if rng.random() < 0.03:
            name = ""
        if name not in taken and name != "__metadata__":
            taken.add(name)
            return name


def rand_shape(rng):
    r = rng.random()
    if r < 0.1:
        return []
    nd = rng.choice([1, 1, 2, 2, 2, 3, 4]) if r < 0.97 else rng.randint(5, 8)
    shape = [rng.randint(1, 5) for _ in range(nd)]
    if rng.random() < 0.1:
        shape[rng.randrange(nd)] = 0
    return shape


def rand_metadata(rng):
    if rng.random() < 0.4:
        return None
    m = {}
    for _ in range(rng.randint(0, 3)):
        m[rng.choice(["format", "k", "\u00e9", "quo\"te", "total", "x y"])] = rng.choice(
            ["pt", "np", "", "v\u00e9", "line\nbreak", "{\"json\":1}", "\\"])
    return m


def torch_tensor(rng, dt, shape):
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if dt == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.randn(shape, generator=g).to(dt)
    if dt.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float32).to(dt)
    hi = 127 if dt == torch.int8 else 255 if dt == torch.uint8 else 30000
    return torch.randint(0, hi, shape, generator=g).to(dt)


def gen_valid_torch(rng, path):
    taken, t = set(), {}
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4, 6])):
        dt, _ = rng.choice(TORCH_DTYPES)
        t[rand_name(rng, taken)] = torch_tensor(rng, dt, rand_shape(rng))
    st_torch.save_file(t, path, metadata=rand_metadata(rng))


def gen_valid_numpy(rng, path):
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    taken, t = set(), {}
    for _ in range(rng.choice([0, 1, 2, 3, 5])):
        dt = rng.choice(NUMPY_GEN_DTYPES)
        shape = rand_shape(rng)
        if dt == np.bool_:
            a = nrng.random(shape) > 0.5
        elif np.issubdtype(dt, np.floating):
            a = nrng.standard_normal(shape).astype(dt)
        else:
            a = nrng.integers(0, 100, size=shape).astype(dt)
        t[rand_name(rng, taken)] = np.ascontiguousarray(a)
    st_numpy.save_file(t, path, metadata=rand_metadata(rng))


def tensor_entry(dtype, shape, begin, end):
    return Obj([("dtype", dtype), ("shape", shape), ("data_offsets", [begin, end])])


def gen_valid_layout(rng):
    """A valid file built by hand: JSON order unrelated to file order, zero-length tensors at
    legal offsets (start, between tensors, end, several at one offset), metadata anywhere,
    padding of any JSON whitespace before and after, escaped names."""
    taken, pairs, data, pos = set(), [], b"", 0
    for _ in range(rng.randint(0, 6)):
        dt = rng.choice(list(SL_DTYPES))
        shape = rand_shape(rng)
        nb = SL_DTYPES[dt]
        for d in shape:
            nb *= d
        name = rand_name(rng, taken)
        pairs.append((name, tensor_entry(dt, shape, pos, pos + nb)))
        data += bytes(rng.randrange(256) for _ in range(nb))
        pos += nb
        if rng.random() < 0.3:  # a zero-length tensor at this boundary
            pairs.append((rand_name(rng, taken), tensor_entry(rng.choice(list(SL_DTYPES)), [0, 3], pos, pos)))
    if rng.random() < 0.3:
        pairs.insert(0, (rand_name(rng, taken), tensor_entry("F32", [0], 0, 0)))
    rng.shuffle(pairs)
    if rng.random() < 0.2:  # the same name written with escapes is still one name
        for p in pairs:
            if p[0].isascii() and p[0]:
                p_idx = pairs.index(p)
                pairs[p_idx] = (Raw(b'"' + "".join(f"\\u{ord(c):04x}" for c in p[0]).encode() + b'"'), p[1])
                break
    meta = rand_metadata(rng)
    if meta is not None:
        pairs.insert(rng.randint(0, len(pairs)), ("__metadata__", Obj(meta.items())))
    ws = [b" ", b"\t", b"\n", b"\r"]
    lead = b"".join(rng.choice(ws) for _ in range(rng.choice([0, 0, 1, 3])))
    trail = b"".join(rng.choice(ws) for _ in range(rng.choice([0, 1, 7, 100])))
    return Model(Obj(pairs), data, lead, trail)


# ---- mutations ----------------------------------------------------------------------------

BIG = [2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 10 ** 30]
BAD_NUMBERS = [-1, Raw("-0"), 2.0, Raw("1e0"), Raw("1E1"), Raw("0.5"), Raw("-0.0"), "1", None, True, [1], Obj(),
               Raw("01"), Raw("+1"), Raw("0x1"), Raw("1."), Raw(".5"), Raw("NaN"), Raw("Infinity")] + BIG
UNKNOWN_DTYPES = ["f32", "F128", "", "F32 ", " F32", "FLOAT32", "float32", "U4", "Q8", "F8", "BF32", "I128",
                  "F8_E4M3FN", "bool"] + list(REF_ONLY_DTYPES)
WS_BAD = [b"\x0b", b"\x0c", b"\x00", b"\xc2\xa0", b"\xef\xbb\xbf", b"\xe2\x80\x8b", b"\x1c"]
BAD_UTF8 = [b"\xff", b"\xfe", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
            b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\x80", b"\xc3",
            b"\xf0\x9f\x98"]
GOOD_UTF8 = [b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf",
             b"\xee\x80\x80"]
NAME_ESCAPES = [r'"\u0000"', r'"a\u0000b"', r'"\ud800"', r'"\udc00x"', r'"\ud83d\ude00"', r'"\u00e9"',
                r'"\/x"', r'"\b\f\n\r\t"', r'"\x41"', r'"\a"', r'"\u12"', '"a\x01"', '"a\x7f"', '"a\x1f"',
                r'"\uD83D\uDE00"', r'"\uDBFF\uDFFF"']


def pick_tensor(rng, m):
    ts = m.tensors()
    return rng.choice(ts) if ts else (None, None)


def set_tensor_field(rng, m, field, value):
    _, e = pick_tensor(rng, m)
    if e is None:
        return False
    e.set(field, value)
    return True


def mut_dup_tensor(rng, m):
    name, e = pick_tensor(rng, m)
    if e is None:
        return None
    other = rng.choice(m.tensors())[1]
    m.header.pairs.insert(rng.randint(0, len(m.header.pairs)), [name, deep(rng.choice([e, other]))])
    return "dup-tensor-key"


def mut_dup_escaped(rng, m):
    for k, e in m.tensors():
        if isinstance(k, str) and k and k.isascii():
            esc = Raw(b'"' + "".join(f"\\u{ord(c):04x}" for c in k).encode() + b'"')
            m.header.pairs.append([esc, deep(e)])
            return "dup-tensor-key-escaped"
    return None


def mut_dup_field(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    f = rng.choice(["dtype", "shape", "data_offsets"])
    v = e.get(f)
    alt = {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}[f]
    e.pairs.insert(rng.randint(0, len(e.pairs)), [f, deep(rng.choice([v, alt]))])
    return "dup-field-" + f


def mut_dup_meta(rng, m):
    if not isinstance(m.header, Obj):
        return None
    meta = m.header.get("__metadata__")
    if rng.random() < 0.5 or not isinstance(meta, Obj) or not meta.pairs:
        m.header.pairs.append(["__metadata__", Obj([("k", "v")])])
        if meta is None:
            m.header.pairs.append(["__metadata__", Obj()])
        return "dup-metadata"
    k = meta.pairs[0][0]
    meta.pairs.append([k, "other"])
    return "dup-metadata-key"


def mut_root(rng, m):
    choice = rng.choice(["[]", "array", "string", "number", "null", "true", "nested"])
    m.header = {"[]": [], "array": [m.header], "string": Raw('"{}"'), "number": 1, "null": None, "true": True,
                "nested": Obj([("tensors", m.header)])}[choice]
    return "root-" + choice


def mut_entry_type(rng, m):
    if not isinstance(m.header, Obj):
        return None
    name, e = pick_tensor(rng, m)
    if e is None:
        return None
    v = rng.choice([None, [], "F32", 1, True, [e.get("dtype"), e.get("shape"), e.get("data_offsets")]])
    m.header.set(name, v)
    return "tensor-entry-type"


def mut_dtype(rng, m):
    r = rng.random()
    if r < 0.6:
        v = rng.choice(UNKNOWN_DTYPES)
        tag = "dtype-unknown"
    elif r < 0.8:
        v = rng.choice([1, None, ["F32"], Obj(), True, 4.0])
        tag = "dtype-type"
    else:
        v = rng.choice(list(SL_DTYPES))  # another known dtype: sizes may or may not fit
        tag = "dtype-other"
    return tag if set_tensor_field(rng, m, "dtype", v) else None


def mut_dtype_ref_only(rng, m):
    """A dtype only the reference knows, with offsets sized for it (documented divergence)."""
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    dt = rng.choice(list(REF_ONLY_DTYPES))
    bits = REF_ONLY_DTYPES[dt]
    shape, offs = e.get("shape"), e.get("data_offsets")
    if not isinstance(shape, list) or not isinstance(offs, list) or len(offs) != 2 or not all(
            isinstance(x, int) for x in offs):
        return None
    size = offs[1] - offs[0]
    if size * 8 % bits:
        return None
    e.set("dtype", dt)
    e.set("shape", [size * 8 // bits])
    return "dtype-ref-only"


def mut_shape_type(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    e.set("shape", rng.choice(["[3]", 3, None, Obj(), True, Raw("[1,]"), Raw("[,1]")]))
    return "shape-type"


def mut_shape_entry(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None or not isinstance(e.get("shape"), list):
        return None
    shape = e.get("shape")
    v = rng.choice(BAD_NUMBERS)
    if shape and rng.random() < 0.7:
        shape[rng.randrange(len(shape))] = v
    else:
        shape.insert(rng.randint(0, len(shape)), v)
    return "shape-entry"


def mut_shape_zero_big(rng, m):
    """Huge entries next to a 0: the product is 0, unless it overflows before reaching the 0."""
    _, e = pick_tensor(rng, m)
    if e is None or not isinstance(e.get("data_offsets"), list) or len(e.get("data_offsets")) != 2:
        return None
    offs = e.get("data_offsets")
    variants = [[0, 2 ** 32, 2 ** 32], [2 ** 32, 2 ** 32, 0], [2 ** 32, 0, 2 ** 32], [2 ** 62, 0], [2 ** 63 - 1, 0],
                [2 ** 63, 0], [2 ** 64 - 1, 0], [0, 2 ** 64 - 1], [2 ** 31, 2 ** 31, 0], [2 ** 32 - 1, 2 ** 32 + 1, 0],
                [4, 2 ** 62, 0], [0] + [2 ** 63 - 1] * 3]
    e.set("shape", deep(rng.choice(variants)))
    # the tensor is empty if the product is 0: make the offsets say so and drop its bytes
    size = offs[1] - offs[0] if all(isinstance(x, int) for x in offs) else 0
    shift_after(m, offs[0], -size) if size > 0 else None
    e.set("data_offsets", [offs[0], offs[0]])
    return "shape-zero-big"


def mut_shape_overflow(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    dt = e.get("dtype")
    v = rng.choice([[2 ** 32, 2 ** 32, 16], [2 ** 62, 4], [2 ** 61, 8], [2 ** 63 - 1, 2], [2 ** 64 - 1],
                    [2 ** 61], [2 ** 60, 3], [2 ** 21] * 3, [2 ** 16] * 4, [4611686018427387904]])
    e.set("shape", deep(v))
    if rng.random() < 0.5:
        prod = 1
        for d in v:
            prod *= d
        nb = prod * SL_DTYPES.get(dt, 1)
        offs = e.get("data_offsets")
        if isinstance(offs, list) and len(offs) == 2 and isinstance(offs[0], int):
            e.set("data_offsets", [offs[0], offs[0] + nb])
    return "shape-overflow"


def mut_dims(rng, m):
    """More (or exactly 8) dims with the same element count: only the dim limit can object."""
    _, e = pick_tensor(rng, m)
    if e is None or not isinstance(e.get("shape"), list):
        return None
    shape = list(e.get("shape"))
    want = rng.choice([8, 9, 9, 10, 16, 33, 64, 200])
    while len(shape) < want:
        shape.insert(rng.randint(0, len(shape)), 1)
    e.set("shape", shape)
    return "dims-%s" % ("8" if want == 8 else "9+")


def mut_scalar_or_empty(rng, m):
    """0-d and empty tensors with consistent offsets."""
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    dt, offs = e.get("dtype"), e.get("data_offsets")
    if dt not in SL_DTYPES or not isinstance(offs, list) or len(offs) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in offs):
        return None
    size = offs[1] - offs[0]
    if rng.random() < 0.5:
        new = SL_DTYPES[dt]
        e.set("shape", [])
        tag = "scalar"
    else:
        new = 0
        e.set("shape", rng.choice([[0], [0, 5], [3, 0, 2], [1, 0]]))
        tag = "empty-tensor"
    shift_after(m, offs[0], new - size, at=offs[0] + min(size, new))
    e.set("data_offsets", [offs[0], offs[0] + new])
    return tag


def shift_after(m, begin, delta, at=None):
    """Moves every tensor that begins after BEGIN by DELTA and resizes the data to match,
    keeping the file consistent."""
    for _, e in m.tensors():
        o = e.get("data_offsets")
        if isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o) and o[0] > begin:
            e.set("data_offsets", [o[0] + delta, o[1] + delta])
    at = begin if at is None else at
    if delta > 0:
        m.data = m.data[:at] + bytes(delta) + m.data[at:]
    elif delta < 0:
        m.data = m.data[:at] + m.data[at - delta:]


def mut_offsets_value(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    o = e.get("data_offsets")
    if not isinstance(o, list) or len(o) != 2:
        return None
    b, en = o
    r = rng.random()
    if r < 0.5 and isinstance(b, int) and isinstance(en, int):
        v = rng.choice([[b + 1, en + 1], [b - 1, en - 1], [b, en + 1], [b, en - 1], [b + 1, en], [b - 1, en],
                        [en, b], [b, b], [en, en], [0, en - b], [b + 2 ** 63, en], [b, en + 2 ** 64]])
        tag = "offsets-shift"
    elif r < 0.75:
        v = [b, en]
        v[rng.randrange(2)] = rng.choice(BAD_NUMBERS)
        tag = "offsets-entry"
    else:
        v = rng.choice([[b], [b, en, en], [], Obj([("0", b), ("1", en)]), "[0,0]", None, [[b, en]], Raw("[0,]")])
        tag = "offsets-type"
    e.set("data_offsets", v)
    return tag


def mut_layout(rng, m):
    ts = [(k, e) for k, e in m.tensors() if isinstance(e.get("data_offsets"), list)
          and len(e.get("data_offsets")) == 2 and all(isinstance(x, int) for x in e.get("data_offsets"))]
    if not ts:
        return None
    k, e = rng.choice(ts)
    b, en = e.get("data_offsets")
    r = rng.randrange(6)
    if r == 0:  # a hole: this tensor and all after it move on, the data grows with them
        d = rng.choice([1, 4, 8])
        shift_after(m, b - 1, d, at=b)
        return "hole"
    if r == 1:  # a hole without the data growing
        shift_after(m, b - 1, 0)
        e.set("data_offsets", [b + 1, en + 1])
        return "hole-nodata"
    if r == 2:  # overlap: moves back into the previous tensor
        if b == 0:
            return None
        d = rng.choice([1, min(b, 4)])
        e.set("data_offsets", [b - d, en - d])
        return "overlap"
    if r == 3:  # two tensors swap places: valid when the sizes agree, else not
        if len(ts) < 2:
            return None
        _, e2 = rng.choice([t for t in ts if t[1] is not e])
        o1, o2 = e.get("data_offsets"), e2.get("data_offsets")
        e.set("data_offsets", o2)
        e2.set("data_offsets", o1)
        return "swap-offsets-%s" % ("same" if o1[1] - o1[0] == o2[1] - o2[0] else "diff")
    if r == 4:  # two tensors swap places with shapes and dtypes: always a valid layout
        if len(ts) < 2:
            return None
        _, e2 = rng.choice([t for t in ts if t[1] is not e])
        o1, o2 = e.get("data_offsets"), e2.get("data_offsets")
        s1, s2 = e.get("shape"), e2.get("shape")
        d1, d2 = e.get("dtype"), e2.get("dtype")
        e.set("data_offsets", o2), e.set("shape", s2), e.set("dtype", d2)
        e2.set("data_offsets", o1), e2.set("shape", s1), e2.set("dtype", d1)
        return "swap-entries"
    # a zero-length tensor at some offset
    at = rng.choice([0, b, en, len(m.data), len(m.data) + 1, b + 1 if en > b + 1 else en])
    m.header.pairs.insert(rng.randint(0, len(m.header.pairs)), ["zz.empty", tensor_entry("U8", [0], at, at)])
    return "empty-at-offset"


def mut_data(rng, m):
    r = rng.randrange(4)
    if r == 0:
        m.data += bytes(rng.choice([1, 7, 8, 100]))
        return "data-trailing"
    if r == 1 and m.data:
        m.data = m.data[:-rng.randint(1, len(m.data))]
        return "data-short"
    if r == 2:
        m.data = b""
        return "data-none"
    m.data += b" "
    return "data-trailing-space"


def mut_missing_field(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    f = rng.choice(["dtype", "shape", "data_offsets"])
    e.remove(f)
    return "missing-" + f


def mut_extra_field(rng, m):
    _, e = pick_tensor(rng, m)
    if e is None:
        return None
    k = rng.choice(["extra", "DTYPE", "dtype ", "offsets", "__metadata__", "", "Shape"])
    v = rng.choice([1, None, Obj(), "x", [1, 2], Raw("[" * 200 + "]" * 200), Raw("[" * 100 + "]" * 100)])
    e.pairs.insert(rng.randint(0, len(e.pairs)), [k, v])
    return "extra-field"


def mut_metadata(rng, m):
    if not isinstance(m.header, Obj):
        return None
    r = rng.random()
    if r < 0.45:
        v = rng.choice([1, -1, 1.5, None, True, [], ["a"], Obj(), Obj([("a", "b")]), Raw("-0")])
        meta = m.header.get("__metadata__")
        if not isinstance(meta, Obj):
            meta = Obj()
            m.header.pairs.insert(0, ["__metadata__", meta])
        meta.pairs.insert(rng.randint(0, len(meta.pairs)), [rng.choice(["k", "format", "n"]) + "_", v])
        tag = "metadata-value-type"
    elif r < 0.8:
        m.header.remove("__metadata__")
        m.header.pairs.insert(rng.randint(0, len(m.header.pairs)),
                              ["__metadata__", rng.choice([None, [], ["a", "b"], "pt", 1, True, Raw("[]")])])
        tag = "metadata-type"
    elif r < 0.9:
        m.header.remove("__metadata__")
        m.header.pairs.insert(rng.randint(0, len(m.header.pairs)),
                              ["__metadata__", Obj(rng.choice([[], [("", "")], [("\u00e9", "\U0001F600")],
                                                               [("k", Raw(r'"a\u0000b"'))],
                                                               [(Raw(r'"\u0000"'), "v")],
                                                               [("k", Raw(r'"\ud800"'))]]))])
        tag = "metadata-strings"
    else:  # a tensor-shaped entry named like metadata, or metadata named like a tensor
        name = rng.choice(["__METADATA__", "__metadata", "_metadata_", "__metadata__ "])
        m.header.pairs.append([name, tensor_entry("U8", [0], 0, 0)])
        tag = "metadata-lookalike"
    return tag


def mut_name(rng, m):
    if not isinstance(m.header, Obj):
        return None
    ts = [p for p in m.header.pairs if p[0] != "__metadata__"]
    if not ts:
        return None
    p = rng.choice(ts)
    r = rng.random()
    if r < 0.5:
        p[0] = Raw(rng.choice(NAME_ESCAPES))
        return "name-escape"
    if r < 0.8:
        bad = rng.choice(BAD_UTF8)
        p[0] = Raw(b'"x' + bad + b'y"')
        return "name-bad-utf8"
    p[0] = Raw(b'"' + rng.choice(GOOD_UTF8) + b'"')
    return "name-good-utf8"


def mut_utf8_elsewhere(rng, m):
    bad = rng.choice(BAD_UTF8)
    r = rng.randrange(3)
    if r == 0:
        m.trail = m.trail + bad
    elif r == 1:
        m.lead = bad + m.lead
    else:
        if not isinstance(m.header, Obj):
            return None
        m.header.remove("__metadata__")
        m.header.pairs.insert(0, ["__metadata__", Obj([("k", Raw(b'"' + bad + b'"'))])])
    return "bad-utf8-" + ["trail", "lead", "metadata"][r]


def mut_whitespace(rng, m):
    ws = [b" ", b"\t", b"\n", b"\r"]
    r = rng.randrange(5)
    if r == 0:
        m.lead = b"".join(rng.choice(ws) for _ in range(rng.randint(1, 9)))
        return "ws-lead"
    if r == 1:
        m.trail = b"".join(rng.choice(ws) for _ in range(rng.randint(0, 40)))
        return "ws-trail"
    if r == 2:
        m.lead = rng.choice(WS_BAD)
        return "ws-lead-bad"
    if r == 3:
        m.trail = m.trail + rng.choice(WS_BAD)
        return "ws-trail-bad"
    m.lead, m.trail = b" \n", b"\t  \r\n"
    return "ws-both"


def mut_inner_whitespace(rng, m):
    """Whitespace inside the JSON text, between every token."""
    h = m.header_bytes()
    ws = rng.choice([b" ", b"\n\t", b"\r\n   "])
    out, in_str, esc = bytearray(), False, False
    for c in h:
        ch = bytes([c])
        if in_str:
            out += ch
            if esc:
                esc = False
            elif ch == b"\\":
                esc = True
            elif ch == b'"':
                in_str = False
            continue
        if ch == b'"':
            in_str = True
        out += ch
        if ch in b"{}[],:":
            out += ws
    m.header, m.lead, m.trail = Raw(bytes(out)), b"", b""
    return "ws-inner"


def mut_garbage_after(rng, m):
    m.trail = m.trail + rng.choice([b"x", b"{}", b"}", b",", b"\x00", b"null", b"//c", b"/*c*/"])
    return "garbage-after-json"


def mut_json_syntax(rng, m):
    """One random byte of the JSON text replaced, inserted or deleted (n follows)."""
    h = bytearray(m.header_bytes())
    if not h:
        return None
    i = rng.randrange(len(h))
    c = rng.choice(b' {}[]":,-+.0123456789eEtfnu\\\x00\x01\x7f\xff\xc3')
    r = rng.randrange(3)
    if r == 0:
        h[i] = c
    elif r == 1:
        h.insert(i, c)
    else:
        del h[i]
    m.header, m.lead, m.trail = Raw(bytes(h)), b"", b""
    return "json-byte-" + ["replace", "insert", "delete"][r]


def mut_negative_zero(rng, m):
    """A 0 in a shape or in data_offsets written as -0: JSON's integer grammar allows it, the
    reference (serde_json) reads it as the float -0.0 and refuses it."""
    spots = []
    for _, e in m.tensors():
        for f in ("shape", "data_offsets"):
            v = e.get(f)
            if isinstance(v, list):
                spots += [(v, i) for i, x in enumerate(v) if x == 0 and not isinstance(x, bool)]
    if not spots:
        return None
    v, i = rng.choice(spots)
    v[i] = Raw(rng.choice(["-0", "-0", "0", "-0.0", "0e0", "-0E+0"]))
    return "negative-zero"


def escape_str(s, rng):
    return Raw('"' + "".join(f"\\u{ord(c):04x}" if c.isascii() and rng.random() < 0.5 else
                             json.dumps(c, ensure_ascii=False)[1:-1] for c in s) + '"')


def mut_escape_spelling(rng, m):
    """The same header with keys and dtype strings spelled with \\u escapes: still valid."""
    if not isinstance(m.header, Obj):
        return None
    for p in m.header.pairs:
        if isinstance(p[0], str) and rng.random() < 0.7:
            p[0] = escape_str(p[0], rng)
        if isinstance(p[1], Obj):
            for q in p[1].pairs:
                if isinstance(q[0], str) and rng.random() < 0.7:
                    q[0] = escape_str(q[0], rng)
                if isinstance(q[1], str) and rng.random() < 0.7:
                    q[1] = escape_str(q[1], rng)
    return "escape-spelling"


def mut_stray_byte(rng, m):
    """A byte slipped in at a token boundary: after a number, a string, a delimiter. Only JSON
    whitespace is harmless there; a NUL after a number once got past jansson."""
    h = m.header_bytes()
    spots, in_str, esc = [], False, False
    for i, c in enumerate(h):
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
                spots.append((i + 1, "string"))
            continue
        if c == 0x22:
            in_str = True
        elif chr(c) in "0123456789":
            if i + 1 < len(h) and chr(h[i + 1]) not in "0123456789":
                spots += [(i + 1, "number")] * 3
        elif chr(c) in "{}[],:":
            spots.append((i + 1, "delimiter"))
    if not spots:
        return None
    at, kind = rng.choice(spots)
    b = rng.choice([b"\x00", b"\x00", b"\x01", b"\x0b", b"\x0c", b"\x1f", b"\x7f", b"\xc2\xa0", b" ", b"\t",
                    b"\x00\x00"])
    m.header, m.lead, m.trail = Raw(h[:at] + b + h[at:]), b"", b""
    return "stray-byte-after-" + kind


MODEL_MUTATIONS = [mut_stray_byte, mut_stray_byte, mut_dup_tensor, mut_dup_escaped, mut_dup_field, mut_dup_meta, mut_root, mut_entry_type,
                   mut_dtype, mut_dtype_ref_only, mut_shape_type, mut_shape_entry, mut_shape_zero_big,
                   mut_shape_overflow, mut_dims, mut_scalar_or_empty, mut_offsets_value, mut_negative_zero,
                   mut_negative_zero, mut_layout, mut_layout, mut_data, mut_missing_field, mut_extra_field,
                   mut_metadata, mut_name, mut_escape_spelling, mut_utf8_elsewhere, mut_whitespace,
                   mut_inner_whitespace, mut_garbage_after, mut_json_syntax, mut_json_syntax]


def byte_mutations(rng, m):
    """Mutations of the built file: the length field and truncations at the interesting points."""
    b = m.build()
    n = len(m.header_bytes())
    out = []
    for v, tag in [(n + 1, "len+1"), (n - 1, "len-1"), (0, "len-0"), (2 ** 64 - 1, "len-u64max"),
                   (2 ** 63, "len-2^63"), (2 ** 32 + n, "len-2^32+n"), (MAX_HEADER + 1, "len-max+1"),
                   (MAX_HEADER, "len-max"), (len(b) - 8, "len-rest"), (len(b) - 7, "len-rest+1")]:
        if rng.random() < 0.5:
            out.append(("hdrlen-" + tag, le64(v) + b[8:]))
    cuts = {0, 1, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1, len(b) - 1}
    for _, e in m.tensors():
        o = e.get("data_offsets")
        if isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o):
            cuts |= {8 + n + o[0], 8 + n + o[1] - 1}
    for c in sorted(cuts):
        if 0 <= c < len(b) and rng.random() < 0.35:
            out.append(("truncate", b[:c]))
            if rng.random() < 0.3:  # truncated with the length field made to agree
                hb = b[8:c] if c >= 8 else b""
                out.append(("truncate-len-fixed", le64(len(hb)) + hb))
    return out


# ---- the two judges -------------------------------------------------------------------------

def header_dtypes(b):
    """The dtypes a file's header names, by a lenient reading (to pick the reference framework)."""
    try:
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n].decode("utf-8"))
        return {v.get("dtype") for k, v in h.items() if k != "__metadata__" and isinstance(v, dict)}
    except Exception:
        return None


def header_begins(b):
    """name -> begin offset per the header (last duplicate wins, as in the reference)."""
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n].decode("utf-8"))
    return 8 + n, {k: v["data_offsets"][0] for k, v in h.items() if k != "__metadata__"}


def tensor_bytes(t):
    if torch is not None and isinstance(t, torch.Tensor):
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(t).tobytes()


def ref_judge(path, fw):
    """(header_ok, full_ok, info or error). header_ok: safe_open and every slice's dtype and
    shape; full_ok: also every tensor read by the framework."""
    try:
        f = safe_open(path, fw)
    except Exception as e:
        return False, False, f"{type(e).__name__}: {e}"
    with f:
        info = {"metadata": f.metadata() or {}, "tensors": {}}
        try:
            for k in f.keys():
                s = f.get_slice(k)
                info["tensors"][k] = {"dtype": s.get_dtype(), "shape": list(s.get_shape())}
        except Exception as e:
            return False, False, f"{type(e).__name__}: {e}"
        for k in f.keys():
            try:
                t = f.get_tensor(k)
            except Exception as e:
                return True, False, f"{type(e).__name__}: {e}"
            try:
                info["tensors"][k]["data"] = tensor_bytes(t)
            except Exception:  # read, but not viewable as bytes: skip the byte comparison
                info["tensors"][k]["data"] = None
    return True, True, info


def sl_judge(binary, path):
    p = subprocess.run([binary, "inspect", path, "--json"], capture_output=True, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 0:
        try:
            return True, json.loads(out), err
        except ValueError as e:
            return None, None, f"exit 0 but stdout is not JSON ({e})"
    if p.returncode == 1:
        return False, None, err
    return None, None, f"exit {p.returncode}: {err}"


# Divergence classes where shardload rejects what the reference accepts: (pattern on shardload's
# message, class, documented?). Anything unmatched is a failure.
STRICTER = [
    (r"SL_ERR_DTYPE: .*dtype '([^']*)' is not supported", "documented: dtype shardload does not know", True),
    (r"SL_ERR_UNSUPPORTED: .*shape has (\d+) dims", "documented: more than 8 dims", True),
    (r"duplicate object key", "stricter: duplicate JSON key (the reference keeps the last)", False),
    (r"unknown key '", "stricter: unknown key in a tensor entry (the reference ignores it)", False),
    (r"__metadata__ is a JSON null", "stricter: \"__metadata__\": null (the reference reads no metadata)", False),
    (r"NUL byte in object key|\\u0000 is not allowed", "stricter: \\u0000 in a name or metadata string", False),
    (r"too big integer", "stricter: an integer of 2^63 or more (jansson reads signed 64 bits, the reference u64; "
     "seen where the reference ignores or overwrites the value)", False),
    (r"entry is a JSON array", "stricter: tensor entry as a JSON array [dtype, shape, data_offsets] (serde's "
     "sequence form of a struct; not in the format)", False),
]


def classify_stricter(msg, ref_info):
    for pat, cls, _documented in STRICTER:
        mm = re.search(pat, msg)
        if not mm:
            continue
        if cls.startswith("documented: dtype"):
            dts = {t["dtype"] for t in ref_info["tensors"].values()}
            if mm.group(1) not in REF_ONLY_DTYPES or mm.group(1) not in dts:
                return None
        if cls.startswith("documented: more"):
            if int(mm.group(1)) <= SL_MAX_DIMS or not any(
                    len(t["shape"]) > SL_MAX_DIMS for t in ref_info["tensors"].values()):
                return None
        return cls
    return None


def compare_accepted(b, ref_info, sl, path_of=None):
    """Differences between the reference's view and shardload's report of an accepted file."""
    errs = []
    rt, st = ref_info["tensors"], {t["name"]: t for t in sl["tensors"]}
    if set(rt) != set(st) or len(st) != len(sl["tensors"]):
        return [f"names differ: reference {sorted(rt)} shardload {[t['name'] for t in sl['tensors']]}"]
    if sl["metadata"] != ref_info["metadata"]:
        errs.append(f"metadata differs: reference {ref_info['metadata']} shardload {sl['metadata']}")
    for k, r in rt.items():
        s = st[k]
        if s["dtype"] != r["dtype"] or s["shape"] != r["shape"]:
            errs.append(f"{k!r}: reference {r['dtype']}{r['shape']} shardload {s['dtype']}{s['shape']}")
            continue
        fb = b if path_of is None else path_of.get(s["file"])
        if fb is None:
            errs.append(f"{k!r}: shardload names file {s['file']!r}, which is not a shard of the checkpoint")
            continue
        data_start, begins = header_begins(fb)
        if s["offset"] != data_start + begins[k]:
            errs.append(f"{k!r}: offset {s['offset']}, the header says {data_start + begins[k]}")
        if r["data"] is not None and (s["bytes"] != len(r["data"])
                                      or fb[s["offset"]:s["offset"] + s["bytes"]] != r["data"]):
            errs.append(f"{k!r}: bytes [{s['offset']}, +{s['bytes']}) are not the {len(r['data'])} bytes "
                        f"the reference read")
    return errs


# ---- the run --------------------------------------------------------------------------------

def generate(rng, tmp, count_valid):
    """[(tag, bytes)]: valid files, hand-built layouts and their mutations."""
    bases, writer_bugs = [], []
    for _ in range(count_valid):
        p = os.path.join(tmp, "gen.safetensors")
        r = rng.random()
        if torch is not None and r < 0.45:
            gen_valid_torch(rng, p)
            tag = "valid-torch"
        elif r < 0.7:
            gen_valid_numpy(rng, p)
            tag = "valid-numpy"
        else:
            bases.append(("valid-layout", gen_valid_layout(rng)))
            continue
        with open(p, "rb") as f:
            written = f.read()
        try:
            bases.append((tag, parse_file(written)))
        except ValueError:
            # safetensors 0.8.0 writes '{},"__metadata__":{}}' for no tensors and metadata={}:
            # not JSON. Both readers must refuse it; it is no base for mutations.
            writer_bugs.append((tag + "-writer-bug", written))
    cases = [(tag, m.build()) for tag, m in bases] + writer_bugs
    # fixed corner files
    cases += [("tiny", b""), ("tiny", b"\x02\0\0"), ("tiny", bytes(8)), ("tiny", le64(2) + b"{}"),
              ("tiny", le64(2) + b"{}" + b"\0"), ("tiny", le64(1) + b"{"), ("tiny", le64(8) + b"{}      "),
              ("tiny", le64(8) + b"      {}"), ("tiny", le64(3) + b"{ }"), ("tiny", le64(2) + b"[]"),
              ("tiny", le64(4) + b"null"), ("tiny", le64(3) + b"   "),
              ("tiny", le64(19) + b'{"__metadata__":{}}'), ("tiny", le64(21) + b'{"__metadata__":null}')]
    for tag, m in bases:
        for _ in range(3):
            mm = m.copy()
            tags = []
            for _ in range(rng.choice([1, 1, 1, 2])):
                t = rng.choice(MODEL_MUTATIONS)(rng, mm)
                if t:
                    tags.append(t)
            if tags:
                cases.append(("+".join(tags), mm.build()))
        if rng.random() < 0.45:
            cases += [(f"{t}", bb) for t, bb in byte_mutations(rng, m)]
    return bases, cases


def gen_index_cases(rng, bases):
    """Sharded checkpoints: 2-3 valid shards with distinct names, one of them sometimes mutated."""
    out = []
    good = [m for tag, m in bases if tag.startswith("valid") and m.tensors()]
    for _ in range(40):
        shards, tags = {}, []
        for s in range(rng.randint(2, 3)):
            m = rng.choice(good).copy()
            for p in m.header.pairs:
                if p[0] != "__metadata__":
                    p[0] = f"s{s}." + p[0] if isinstance(p[0], str) else p[0]
            if s == 0 and rng.random() < 0.6:
                t = rng.choice(MODEL_MUTATIONS)(rng, m)
                if t:
                    tags.append(t)
            shards[f"model-{s + 1:05d}-of-00003.safetensors"] = m.build()
        out.append(("index+" + ("+".join(tags) or "valid"), shards))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the shardload command")
    ap.add_argument("--tmp", required=True, help="scratch directory (failing cases are kept there)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--valid", type=int, default=400, help="valid base files to generate and mutate")
    ap.add_argument("-j", "--jobs", type=int, default=max(2, os.cpu_count() or 2))
    ap.add_argument("-v", "--verbose", action="store_true", help="print every divergence")
    args = ap.parse_args()
    args.tmp = os.path.abspath(args.tmp)  # shardload reports absolute file names
    shutil.rmtree(args.tmp, ignore_errors=True)
    os.makedirs(args.tmp)
    t0 = time.time()
    rng = random.Random(args.seed)
    if torch is not None:
        torch.manual_seed(args.seed)
    bases, cases = generate(rng, args.tmp, args.valid)
    index_cases = gen_index_cases(rng, bases)

    # write every case, then run shardload on all of them in parallel
    paths = []
    for i, (tag, b) in enumerate(cases):
        p = os.path.join(args.tmp, f"c{i:05d}.safetensors")
        with open(p, "wb") as f:
            f.write(b)
        paths.append(p)
    ix_paths = []
    for i, (tag, shards) in enumerate(index_cases):
        d = os.path.join(args.tmp, f"ix{i:03d}")
        os.makedirs(d)
        wm = {}
        for fn, b in shards.items():
            with open(os.path.join(d, fn), "wb") as f:
                f.write(b)
            try:
                names = list(header_begins(b)[1])
            except Exception:
                names = []
            # a shard whose header Python cannot read gets a made-up entry, so it is opened
            for k in names or [f"{fn}.unreadable"]:
                wm[k] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
        ix_paths.append(os.path.join(d, "model.safetensors.index.json"))
    with ThreadPoolExecutor(args.jobs) as ex:
        sl_results = list(ex.map(lambda p: sl_judge(args.bin, p), paths + ix_paths))

    classes, notes, failures = Counter(), Counter(), []
    passed = skipped = both_accept = both_reject = 0
    self_checked = False
    for i, (tag, b) in enumerate(cases + index_cases):
        is_index = i >= len(cases)
        sl_ok, sl_rep, sl_msg = sl_results[i]
        if sl_ok is None:
            failures.append((i, tag, f"shardload misbehaved: {sl_msg}"))
            continue
        files = b if is_index else {None: b}
        ref_ok, ref_infos, ref_msgs, undecided = True, {}, [], False
        for fn, fb in files.items():
            fpath = paths[i] if not is_index else os.path.join(os.path.dirname(ix_paths[i - len(cases)]), fn)
            dts = header_dtypes(fb)
            fw = "np" if dts is not None and dts <= NUMPY_DTYPES and (i % 2 or torch is None) else "pt"
            if torch is None and (dts is None or not dts <= NUMPY_DTYPES):
                undecided = True  # the reference cannot read these dtypes without torch
            hdr_ok, full_ok, info = ref_judge(fpath, fw)
            if hdr_ok and not full_ok and fw == "np" and torch is not None:
                # numpy's own limits (array size, 32 dims) are not the format's: ask torch too
                hdr_ok, full_ok, info = ref_judge(fpath, "pt")
            if hdr_ok and not full_ok:
                notes["reference header accepts, its framework cannot read a tensor: "
                      + re.sub(r"\d+", "N", str(info))[:90]] += 1
            if not full_ok:
                ref_ok = False
                ref_msgs.append(str(info))
            else:
                ref_infos[fn] = (fpath, fb, info)
        if undecided and (ref_ok != sl_ok):
            skipped += 1
            continue
        if ref_ok and sl_ok:
            if is_index:
                rt = {}
                for fpath, fb, info in ref_infos.values():
                    rt.update(info["tensors"])
                merged = {"metadata": {"total_size": "0"}, "tensors": rt}
                path_of = {fpath: fb for fpath, fb, _ in ref_infos.values()}
                errs = compare_accepted(None, merged, sl_rep, path_of)
            else:
                errs = compare_accepted(b, ref_infos[None][2], sl_rep)
                if not self_checked and not errs and any(t["bytes"] for t in sl_rep["tensors"]):
                    # the comparison itself must notice a wrong offset, shape or dtype
                    self_checked = True
                    for field in ("offset", "shape", "dtype", "bytes"):
                        wrong = json.loads(json.dumps(sl_rep))
                        t = next(t for t in wrong["tensors"] if t["bytes"])
                        t[field] = {"offset": t["offset"] + 1, "shape": t["shape"] + [7], "bytes": t["bytes"] + 1,
                                    "dtype": "I8" if t["dtype"] == "U64" else "U64"}[field]
                        if not compare_accepted(b, ref_infos[None][2], wrong):
                            failures.append((i, tag, f"self-check: a wrong {field} went unnoticed"))
            if errs:
                failures.append((i, tag, "both accept, but " + "; ".join(errs[:3])))
            else:
                passed += 1
                both_accept += 1
        elif not ref_ok and not sl_ok:
            passed += 1
            both_reject += 1
        elif ref_ok and not sl_ok:
            info = {"tensors": {}}
            for _, _, inf in ref_infos.values():
                info["tensors"].update(inf["tensors"])
            cls = classify_stricter(sl_msg, info)
            if cls:
                classes[cls] += 1
                passed += 1
                if args.verbose:
                    print(f"  [{cls}] case {i} {tag}: {sl_msg}")
            else:
                failures.append((i, tag, f"shardload rejects what the reference accepts: {sl_msg}"))
        else:
            # shardload accepts what the reference rejects: a bug, unless it is leading whitespace
            # the reference alone refuses (the documented exception)
            lead_ok = False
            if not is_index:
                n = struct.unpack("<Q", b[:8])[0]
                h = b[8:8 + n]
                stripped = h.lstrip(b" \t\n\r")
                if stripped != h:
                    p2 = paths[i] + ".nolead"
                    with open(p2, "wb") as f:
                        f.write(le64(len(stripped)) + stripped + b[8 + n:])
                    lead_ok = ref_judge(p2, "pt" if torch is not None else "np")[1]
            if lead_ok:
                classes["documented: leading whitespace before the header JSON"] += 1
                passed += 1
            else:
                why = "; ".join(ref_msgs)[:200]
                failures.append((i, tag, f"shardload ACCEPTS what the reference rejects ({why})"))

    if not self_checked:
        failures.append((-1, "self-check", "no accepted file with data to check the comparison on"))

    # keep only the failing cases on disk
    failing = {i for i, _, _ in failures}
    for i, p in enumerate(paths):
        if i not in failing:
            os.unlink(p)
    for i, p in enumerate(ix_paths):
        if len(cases) + i not in failing:
            shutil.rmtree(os.path.dirname(p))

    for i, tag, why in failures:
        where = (paths[i] if 0 <= i < len(cases) else os.path.dirname(ix_paths[i - len(cases)]) if i >= 0
                 else "-")
        print(f"FAIL case {i} [{tag}] {where}: {why}")
    print(f"{len(cases)} files and {len(index_cases)} sharded checkpoints from seed {args.seed} "
          f"in {time.time() - t0:.1f} s; reference: safetensors.safe_open"
          + ("" if torch is not None else " (numpy only: torch not installed)"))
    tags = Counter(t.split("+")[0] for t, _ in cases)
    print("cases by first mutation: " + ", ".join(f"{k} {v}" for k, v in sorted(tags.items())))
    if classes:
        print("divergences (shardload stricter or documented), all expected:")
        for k, v in sorted(classes.items()):
            print(f"  {v:5d}  {k}")
    if notes:
        print("reference-side notes (its header check accepts, its framework read fails, so it rejects;\n"
              "shardload rejects these too):")
        for k, v in sorted(notes.items()):
            print(f"  {v:5d}  {k}")
    print(f"agreement: {both_accept} accepted by both (names, dtypes, shapes, offsets, bytes and metadata "
          f"equal), {both_reject} rejected by both")
    if skipped:
        print(f"{skipped} cases undecided without torch")
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
