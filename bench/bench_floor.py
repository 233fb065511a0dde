#!/usr/bin/env python3
"""Every-rank reads against their floor: `shardload load CKPT --nproc N --source every-rank`
beside `bench_floor` (N processes each reading its share of CKPT from the page cache into
memory of its own, and nothing else; bench/bench_floor.c), in interleaved rounds. Python
standard library only.

    bench_floor.py --bin build/cpu/shardload --floor build/cpu/bench/bench_floor
    bench_floor.py --dir /tmp/floor --worlds 2,4 --rounds 7 --base /path/to/other/shardload

The checkpoints (made in --dir when missing, `shardload synth`): a 1 GiB BF16 transformer
(`--size 1GiB`) and a 666 MiB F32 one (`--size 666MiB --dtype F32`); --ckpt PATH (repeatable)
takes others. Every configuration runs once as a warm-up (page cache, first touch), then each
round runs every (checkpoint, world) once: the floor (`bench_floor --rounds 1`: one sample of
each variant) and the load, their order flipping each round, so that load from other jobs
falls on both alike. /proc/loadavg is read at the start of each round.

Columns (medians of the rounds):
  floor fresh   bench_floor's go to its last rank done: sl_alloc'd shards (the loader's own
                allocation) and pread straight into them, first touch included
  floor warm    the same preads into shards written before the start: the copy alone
  load s        the slowest rank's sl_load seconds (`load --json`: ranks[].stats.seconds)
  ph1 / ph2     that rank's phase 1 (plan, agreements, allocating the shards) and phase 2
  wall s        the whole command from the outside: fork to exit (start-up, rendezvous,
                headers, load, report, exit)
  fresh/load   floor fresh / load s: issue 20 asks >= 0.8 of the load against its floor
  proc/wall    floor proc / wall s: the same for the whole command
  floor cpu, cmd cpu   every rank's user + system seconds: the floor's proc variant's and the
                whole command's (every process it ran), less moved by other jobs on the machine
                than wall times are
With --base BIN, BIN's load runs in the same rounds too (floor, this, base, rotated).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench_multirank import find_binary  # the same search: --bin, $SHARDLOAD_BIN, PATH, ../build


def cpu_children():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def run(cmd, timeout):
    c0, t0 = cpu_children(), time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    wall, cpu = time.monotonic() - t0, cpu_children() - c0
    if p.returncode != 0:
        sys.exit("bench_floor: %s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return wall, cpu, p.stdout


def run_floor(floor, path, world, timeout):
    _, _, out = run([floor, path, "--nproc", str(world), "--rounds", "1", "--json", "--check"], timeout)
    w = json.loads(out)["worlds"][0]
    return {k: w[k][0] for k in ("fresh", "warm", "proc", "fresh_cpu", "warm_cpu", "proc_cpu")}


def run_load(binary, path, world, timeout):
    wall, cpu, out = run([binary, "load", path, "--nproc", str(world), "--backend", "cpu", "--source", "every-rank",
                     "--json"], timeout)
    ranks = json.loads(out)["ranks"]
    slow = max(ranks, key=lambda r: r["stats"]["seconds"])["stats"]
    return {"wall": wall, "cpu": cpu, "load": slow["seconds"], "ph1": slow["seconds_phase1"],
            "ph2": slow["seconds"] - slow["seconds_phase1"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the shardload command (default: $SHARDLOAD_BIN, PATH, ../build)")
    ap.add_argument("--floor", help="the bench_floor program (default: bench/bench_floor beside --bin)")
    ap.add_argument("--base", help="another shardload command to measure beside it (e.g. main's build)")
    ap.add_argument("--dir", default="/tmp/bench-floor", help="where the checkpoints are made (default /tmp/bench-floor)")
    ap.add_argument("--ckpt", action="append", help="a checkpoint to use instead of the two made in --dir (repeatable)")
    ap.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved measured rounds (default 7)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    ap.add_argument("--json", help="write every sample, the medians and the ratios to this file")
    a = ap.parse_args()
    binary = find_binary(a.bin)
    floor = a.floor or os.path.join(os.path.dirname(os.path.abspath(binary)), "bench", "bench_floor")
    worlds = [int(w) for w in a.worlds.split(",") if w]
    if a.ckpt:
        ckpts = a.ckpt
    else:
        os.makedirs(a.dir, exist_ok=True)
        ckpts = []
        for name, args in (("bf16-1GiB", ["--size", "1GiB"]), ("f32-666MiB", ["--size", "666MiB", "--dtype", "F32"])):
            p = os.path.join(a.dir, name + ".safetensors")
            if not os.path.exists(p):
                subprocess.run([binary, "synth", p] + args, check=True, stdout=subprocess.DEVNULL)
            ckpts.append(p)
    loads = [("this", binary)] + ([("base", a.base)] if a.base else [])
    configs = [(c, w) for c in ckpts for w in worlds]
    kinds = ["floor"] + [k for k, _ in loads]
    exe = dict(loads)

    def one(kind, c, w):
        return run_floor(floor, c, w, a.timeout) if kind == "floor" else run_load(exe[kind], c, w, a.timeout)

    t0 = time.monotonic()
    for c, w in configs:  # warm-up
        for k in kinds:
            one(k, c, w)
    samples = {(k, c, w): [] for k in kinds for c, w in configs}
    loadavg = []
    for r in range(a.rounds):
        loadavg.append(float(open("/proc/loadavg").read().split()[0]))
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]  # rotated: each goes first in turn
        for c, w in configs:
            for k in order:
                samples[(k, c, w)].append(one(k, c, w))
    elapsed = time.monotonic() - t0

    def med(k, c, w, field):
        return statistics.median(s[field] for s in samples[(k, c, w)])

    print("every-rank against its floor: %d rounds after a warm-up, medians; load average at the rounds' "
          "starts %.2f-%.2f (median %.2f); %.0f s in all" % (a.rounds, min(loadavg), max(loadavg),
                                                             statistics.median(loadavg), elapsed))
    head = ("| checkpoint | world | build | floor fresh s | floor warm s | floor proc s | load s | ph1 s | ph2 s "
            "| wall s | fresh/load | proc/wall | floor cpu s | cmd cpu s |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    table = []
    for c, w in configs:
        f, m, pr = med("floor", c, w, "fresh"), med("floor", c, w, "warm"), med("floor", c, w, "proc")
        for k, _ in loads:
            row = {"checkpoint": c, "world": w, "build": k, "floor_fresh": f, "floor_warm": m, "floor_proc": pr,
                   "load": med(k, c, w, "load"), "ph1": med(k, c, w, "ph1"), "ph2": med(k, c, w, "ph2"),
                   "wall": med(k, c, w, "wall"), "floor_cpu": med("floor", c, w, "proc_cpu"),
                   "cpu": med(k, c, w, "cpu")}
            row["fresh_per_load"], row["proc_per_wall"] = f / row["load"], pr / row["wall"]
            table.append(row)
            print("| %s | %d | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f | %.3f |" % (
                os.path.basename(c), w, k, f, m, pr, row["load"], row["ph1"], row["ph2"], row["wall"],
                row["fresh_per_load"], row["proc_per_wall"], row["floor_cpu"], row["cpu"]))
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"rounds": a.rounds, "loadavg": loadavg, "table": table,
                       "samples": [{"kind": k, "checkpoint": c, "world": w, "samples": v}
                                   for (k, c, w), v in samples.items()]}, out, indent=2)


if __name__ == "__main__":
    main()
