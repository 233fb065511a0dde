#!/usr/bin/env python3
"""A checkpoint shaped like Llama-3.1-405B (or a smaller variant), with nothing in it but its
headers: for planners and header-bound benchmarks (`shardload plan --traffic`) at the real
scale without 810 GB of disk. Python standard library only.

    make_shaped_checkpoint.py /tmp/llama405b                   # 126 layers, 191 files, ~812 GB
    make_shaped_checkpoint.py /tmp/tiny --layers 2 --hidden 64 --intermediate 256 --heads 4 \\
        --kv-heads 2 --head-dim 16 --vocab 1000 --files 3

It writes DIR/model.safetensors.index.json and DIR/model-0000K-of-0000N.safetensors named as
Hugging Face names the shards of its Llama checkpoints, with HF Llama tensor names
(model.embed_tokens.weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight,
model.layers.N.mlp.{gate,up,down}_proj.weight, model.layers.N.{input,post_attention}_layernorm
.weight, model.norm.weight, lm_head.weight). Tensors fill the files in the model's order, each
file taking the tensors whose byte midpoint falls in its 1/N of the whole, as HF's sharding by
size does; inside a file the data follow the names sorted, as the safetensors library writes
them. Each file is its header, then the data section extended with os.truncate: sparse, so the
files take almost no disk and read back as zeros. A file system without sparse files would
allocate the whole size; the script refuses one that lacks the room (--force skips the check).
"""
import argparse
import json
import os
import shutil
import sys

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4}


def tensors(a):
    """(name, shape) in the model's order."""
    q_rows, kv_rows = a.heads * a.head_dim, a.kv_heads * a.head_dim
    out = [("model.embed_tokens.weight", [a.vocab, a.hidden])]
    for n in range(a.layers):
        p = f"model.layers.{n}."
        out += [
            (p + "input_layernorm.weight", [a.hidden]),
            (p + "self_attn.q_proj.weight", [q_rows, a.hidden]),
            (p + "self_attn.k_proj.weight", [kv_rows, a.hidden]),
            (p + "self_attn.v_proj.weight", [kv_rows, a.hidden]),
            (p + "self_attn.o_proj.weight", [a.hidden, q_rows]),
            (p + "post_attention_layernorm.weight", [a.hidden]),
            (p + "mlp.gate_proj.weight", [a.intermediate, a.hidden]),
            (p + "mlp.up_proj.weight", [a.intermediate, a.hidden]),
            (p + "mlp.down_proj.weight", [a.hidden, a.intermediate]),
        ]
    out += [("model.norm.weight", [a.hidden]), ("lm_head.weight", [a.vocab, a.hidden])]
    return out


def nbytes(shape, esize):
    n = esize
    for d in shape:
        n *= d
    return n


def split_files(ts, esize, nfiles):
    """File index of each tensor: the one whose share of the bytes holds its midpoint."""
    total = sum(nbytes(s, esize) for _, s in ts)
    out, cum = [], 0
    for _, s in ts:
        b = nbytes(s, esize)
        out.append(min(nfiles - 1, (2 * cum + b) * nfiles // (2 * total)))
        cum += b
    return out, total


def header_bytes(entries, dtype):
    """The safetensors header of ENTRIES [(name, shape, nbytes)] in name order, padded with
    spaces to a multiple of 8 as the safetensors library pads it; and its data size."""
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, b in sorted(entries):
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + b]}
        off += b
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, off


def positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{s}' is not a positive integer")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="directory to write (created; must not hold a checkpoint unless --force)")
    ap.add_argument("--layers", type=positive, default=126)
    ap.add_argument("--hidden", type=positive, default=16384)
    ap.add_argument("--intermediate", type=positive, default=53248)
    ap.add_argument("--heads", type=positive, default=128)
    ap.add_argument("--kv-heads", type=positive, default=8)
    ap.add_argument("--head-dim", type=positive, default=128)
    ap.add_argument("--vocab", type=positive, default=128256)
    ap.add_argument("--files", type=positive, default=191, help="number of shard files (default 191)")
    ap.add_argument("--dtype", choices=sorted(DTYPE_SIZE), default="BF16")
    ap.add_argument("--force", action="store_true",
                    help="replace a checkpoint already in DIR, and skip the free-space check")
    a = ap.parse_args()

    esize = DTYPE_SIZE[a.dtype]
    ts = tensors(a)
    if a.files > len(ts):
        sys.exit(f"make_shaped_checkpoint: --files {a.files} is more than the {len(ts)} tensors; give at most {len(ts)}")
    where, total = split_files(ts, esize, a.files)
    per_file = [[] for _ in range(a.files)]
    for (name, shape), k in zip(ts, where):
        per_file[k].append((name, shape, nbytes(shape, esize)))
    empty = [k + 1 for k, e in enumerate(per_file) if not e]
    if empty:
        sys.exit(f"make_shaped_checkpoint: --files {a.files} leaves file {empty[0]} empty (tensors too large for "
                 f"so many files); give fewer --files")

    index = os.path.join(a.dir, "model.safetensors.index.json")
    if os.path.exists(index) and not a.force:
        sys.exit(f"make_shaped_checkpoint: {a.dir} already holds a checkpoint; give --force to replace it")
    os.makedirs(a.dir, exist_ok=True)
    names = [f"model-{k + 1:05d}-of-{a.files:05d}.safetensors" for k in range(a.files)]
    headers = [header_bytes(e, a.dtype) for e in per_file]
    if not a.force:
        # sparse files cost only their headers; a file system that cannot make them would need it all
        need = sum(len(h) for h, _ in headers) + total
        probe = os.path.join(a.dir, ".sparse-probe")
        with open(probe, "wb") as f:
            f.truncate(1 << 30)
        sparse = os.stat(probe).st_blocks * 512 < (1 << 20)
        os.unlink(probe)
        if not sparse and shutil.disk_usage(a.dir).free < need:
            sys.exit(f"make_shaped_checkpoint: {a.dir} does not make sparse files and lacks the {need} bytes; "
                     f"choose a directory on a file system that does (ext4, xfs, tmpfs)")

    weight_map = {}
    for name, (hdr, data), entries in zip(names, headers, per_file):
        path = os.path.join(a.dir, name)
        with open(path, "wb") as f:
            f.write(hdr)
        os.truncate(path, len(hdr) + data)
        for t in entries:
            weight_map[t[0]] = name
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    print(f"{a.dir}: {len(ts)} tensors, {total} bytes ({total / 1e9:.1f} GB) of {a.dtype} in {a.files} files")


if __name__ == "__main__":
    main()
