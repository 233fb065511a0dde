#!/usr/bin/env python3
"""Distributed readers against rank-0 reads on one host, from storage and from the page cache:
`shardload load CKPT --nproc N --source rank0 | readers --readers R | every-rank`, in
interleaved rounds. Python standard library only.

    bench_readers.py --bin build/cpu/shardload --dir /tmp/readers --world 4 --readers 2,4 --rounds 5

The checkpoint (made in --dir when missing, `shardload synth --size 1GiB --shards 8`; --ckpt
PATH takes another). Each round runs every mode twice:
  cold   after `sync; echo 3 > /proc/sys/vm/drop_caches` (root only; skipped otherwise): the
         bytes come from the disk, read by one rank (rank0) or by R ranks at once (readers)
  warm   right after, from the page cache
their order rotating each round. Columns (medians of the rounds): the whole command's wall
seconds, the slowest rank's sl_load seconds, rank 0's bytes read and sent, the busiest
reader's bytes read, and the ratio rank0 / mode of the wall seconds (> 1: faster than rank-0
reads). All ranks run on one host here, so what crosses between them is shared memory: these
figures show the storage side of distributed readers; tests/multihost and bench/readers_model.py
give the network side.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_multirank import find_binary  # the same search: --bin, $SHARDLOAD_BIN, PATH, ../build


def drop_caches():
    if os.geteuid() != 0:
        return False
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    return True


def run_load(bin_, ckpt, world, mode, timeout):
    cmd = [bin_, "load", ckpt, "--nproc", str(world), "--backend", "cpu", "--json"] + mode
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("bench_readers: %s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    ranks = json.loads(p.stdout)["ranks"]
    return {
        "wall": wall,
        "load": max(r["stats"]["seconds"] for r in ranks),
        "read0": ranks[0]["stats"]["bytes_read"],
        "sent0": ranks[0]["stats"]["bytes_sent"],
        "read_max": max(r["stats"]["bytes_read"] for r in ranks),
        "readers": sum(1 for r in ranks if r["stats"]["bytes_read"] > 0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin")
    ap.add_argument("--dir", default="/tmp/shardload-bench-readers")
    ap.add_argument("--ckpt")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--readers", default="2,4", help="reader counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    bin_ = find_binary(a.bin)
    ckpt = a.ckpt
    if not ckpt:
        ckpt = os.path.join(a.dir, "ckpt-1g")
        if not os.path.exists(ckpt):
            os.makedirs(a.dir, exist_ok=True)
            subprocess.run([bin_, "synth", ckpt, "--size", "1GiB", "--shards", "8"], check=True,
                           stdout=subprocess.DEVNULL)
    modes = [("rank0", ["--source", "rank0"])]
    modes += [(f"readers {r}", ["--source", "readers", "--readers", str(r)]) for r in map(int, a.readers.split(","))]
    modes += [("every-rank", ["--source", "every-rank"])]
    can_cold = os.geteuid() == 0
    temps = ["cold", "warm"] if can_cold else ["warm"]
    if not can_cold:
        print("bench_readers: not root: no cold-cache runs (drop_caches needs root)", file=sys.stderr)
    # warm-up: page cache, first touch, the binary's pages
    for _, m in modes:
        run_load(bin_, ckpt, a.world, m, a.timeout)
    res = {(n, t): [] for n, _ in modes for t in temps}
    loads = []
    for k in range(a.rounds):
        loads.append(open("/proc/loadavg").read().split()[0])
        order = modes[k % len(modes):] + modes[:k % len(modes)]
        for n, m in order:
            for t in temps:
                if t == "cold":
                    drop_caches()
                res[(n, t)].append(run_load(bin_, ckpt, a.world, m, a.timeout))
    size = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt)) if os.path.isdir(ckpt) \
        else os.path.getsize(ckpt)
    print(f"checkpoint {ckpt}: {size / 2**20:.0f} MiB; world {a.world} on one host; {a.rounds} rounds "
          f"(load average at each round's start: {' '.join(loads)}); medians")
    print(f"{'cache':5} {'mode':12} {'wall s':>7} {'load s':>7} {'r0 read MiB':>12} {'r0 sent MiB':>12} "
          f"{'max read MiB':>13} {'readers':>7} {'rank0/this':>10}")
    for t in temps:
        base = statistics.median(x["wall"] for x in res[("rank0", t)])
        for n, _ in modes:
            xs = res[(n, t)]
            med = lambda key: statistics.median(x[key] for x in xs)
            print(f"{t:5} {n:12} {med('wall'):7.2f} {med('load'):7.2f} {med('read0') / 2**20:12.0f} "
                  f"{med('sent0') / 2**20:12.0f} {med('read_max') / 2**20:13.0f} {int(med('readers')):7d} "
                  f"{base / med('wall'):10.2f}")


if __name__ == "__main__":
    main()
