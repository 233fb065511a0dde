#!/usr/bin/env python3
"""The tensor-count curve: the whole `shardload load PATH --nproc N` command on checkpoints of
the same total bytes cut into 1, 500, 5,000, 50,000 and 200,000 tensors, so that every cost
paid per tensor outside the data phase (headers, manifests, plans, reports, the launcher) shows
as the ratio to one tensor. Python standard library only.

    bench_tensor_count.py /tmp/tcount                 # checkpoints made there when missing
    bench_tensor_count.py /tmp/tcount --size 100MiB --counts 1,500,5000,50000,200000 --worlds 2,4

The checkpoints are `shardload synth DIR/tN.safetensors --size SIZE --tensors N` (flat 1-D BF16
tensors of equal size). Every configuration (world, source, count) runs once as a warm-up, then
the rounds interleave every configuration (round 1 runs each once, then round 2, ...), so that
load from other jobs on the machine falls on all of them alike, each round in its own order
(shuffled, seeded by the round). Each measured run comes right after --prime unmeasured runs of
the same configuration (default 1): on the 2-core VM of bench/README.md a run right after a
200,000-tensor one took 2-3x as long whichever build it was (the kernel taking back that run's
memory meanwhile), and in a fixed order that fell on the same configuration every round. Each run is timed from the
outside: fork of the command to its exit, the human report read whole (--json with --json).

Columns: the median wall time of the rounds for each count, and its ratio to the median for
one tensor of the same world and source. With --base BIN, every run is made with BIN too, in the
same rounds (the two alternate), and each row is shown for both commands.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import time

from bench_multirank import find_binary  # the same search: --bin, $SHARDLOAD_BIN, PATH, ../build


def run_once(binary, path, world, source, as_json, timeout):
    cmd = [binary, "load", path, "--nproc", str(world), "--backend", "cpu", "--source", source]
    if as_json:
        cmd.append("--json")
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit("bench_tensor_count: %s exited %d: %s" % (" ".join(cmd), p.returncode,
                                                           p.stderr.decode(errors="replace").strip()))
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="directory of the checkpoints (made there when missing)")
    ap.add_argument("--bin", help="the shardload command (default: $SHARDLOAD_BIN, PATH, ../build)")
    ap.add_argument("--size", default="100MiB", help="total tensor bytes of every checkpoint (default 100MiB)")
    ap.add_argument("--counts", default="1,500,5000,50000,200000",
                    help="tensor counts, comma-separated; 1 is added when missing (default 1,500,5000,50000,200000)")
    ap.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--sources", default="rank0,every-rank", help="--source values (default rank0,every-rank)")
    ap.add_argument("--json", action="store_true", help="run with --json (per-tensor reports) instead")
    ap.add_argument("--base", help="another shardload command to measure beside it (e.g. main's build)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved measured rounds (default 3)")
    ap.add_argument("--prime", type=int, default=1,
                    help="unmeasured runs of a configuration right before each measured one (default 1)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    a = ap.parse_args()
    binary = find_binary(a.bin)
    counts = sorted({int(c) for c in a.counts.split(",") if c} | {1})
    worlds = [int(w) for w in a.worlds.split(",") if w]
    sources = [s for s in a.sources.split(",") if s]
    os.makedirs(a.dir, exist_ok=True)
    paths = {}
    for n in counts:
        # the size is in the name: a checkpoint of another --size is never taken for this one
        p = os.path.join(a.dir, "t%d-%s.safetensors" % (n, a.size))
        if not os.path.exists(p):
            subprocess.run([binary, "synth", p, "--size", a.size, "--tensors", str(n)], check=True,
                           stdout=subprocess.DEVNULL)
        paths[n] = p

    bins = [("this", binary)] + ([("base", a.base)] if a.base else [])
    configs = [(b, w, s, n) for w in worlds for s in sources for n in counts for b, _ in bins]
    exe = dict(bins)
    t0 = time.monotonic()
    for c in configs:  # warm-up: page cache, first touch
        run_once(exe[c[0]], paths[c[3]], c[1], c[2], a.json, a.timeout)
    walls = {c: [] for c in configs}
    for r in range(a.rounds):
        order = list(configs)
        random.Random(r).shuffle(order)
        for c in order:
            for _ in range(a.prime):
                run_once(exe[c[0]], paths[c[3]], c[1], c[2], a.json, a.timeout)
            walls[c].append(run_once(exe[c[0]], paths[c[3]], c[1], c[2], a.json, a.timeout))
        print("  round %d of %d done" % (r + 1, a.rounds), file=sys.stderr, flush=True)

    print("%s of tensors in each checkpoint; whole `load --nproc N --backend cpu%s` wall time, median of "
          "%d interleaved rounds after a warm-up; ratio to one tensor" % (a.size, " --json" if a.json else "",
                                                                         a.rounds))
    if a.base:
        print("this: %s; base: %s" % (binary, a.base))
    hdr = "%-5s  %-10s  %-4s" % ("world", "source", "bin") + "".join("  %17s" % ("%d tensors" % n) for n in counts)
    print(hdr)
    print("-" * len(hdr))
    for w in worlds:
        for s in sources:
            for b, _ in bins:
                one = statistics.median(walls[(b, w, s, 1)])
                cells = []
                for n in counts:
                    m = statistics.median(walls[(b, w, s, n)])
                    cells.append("  %8.3f s %5.2fx" % (m, m / one if one > 0 else float("nan")))
                print("%-5d  %-10s  %-4s" % (w, s, b) + "".join(cells))
    print("\ntotal benchmark time: %.0f s" % (time.monotonic() - t0))


if __name__ == "__main__":
    main()
