#!/usr/bin/env python3
"""The command's fixed cost around the load: `shardload load CKPT --nproc N` from the outside
(fork to exit: start-up, rendezvous, load, report, Gloo teardown) beside the slowest rank's
sl_load seconds, for a small checkpoint where the fixed cost is most of the wall and a large
one where it is not. Two builds side by side, interleaved, their order flipping each round.
Python standard library only.

    bench_fixed.py --bin build/cpu/shardload --base /tmp/base/shardload --rounds 9

--base BIN: another build's command; BIN's directory is put first on LD_LIBRARY_PATH, so a
copy of a build's `shardload` and `libshardload.so*` into one directory measures that build
(a build's own RUNPATH would load the library it was built beside). The checkpoints are made
in --dir when missing (`shardload synth`): `small` (4 MiB) and `bf16-1GiB` (1 GiB BF16).
Configurations: small at worlds 2 and 4 with --source rank0 and every-rank, and the 1 GiB one
at world 2 with every-rank. Every configuration runs once per build as a warm-up.

Columns (medians of the rounds): wall s (the whole command), load s (the slowest rank's
ranks[].stats.seconds), fixed s (wall - load: what the command costs around the load), cpu s
(user + system of every process the command ran), and base/this ratios of wall and fixed.
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


def run_load(binary, path, world, source, timeout):
    env = dict(os.environ)
    if binary.get("libdir"):
        env["LD_LIBRARY_PATH"] = binary["libdir"] + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [binary["path"], "load", path, "--nproc", str(world), "--backend", "cpu", "--source", source, "--json"]
    c0, t0 = cpu_children(), time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, env=env)
    wall, cpu = time.monotonic() - t0, cpu_children() - c0
    if p.returncode != 0:
        sys.exit("bench_fixed: %s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    load = max(r["stats"]["seconds"] for r in json.loads(p.stdout)["ranks"])
    return {"wall": wall, "load": load, "fixed": wall - load, "cpu": cpu}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", help="the shardload command (default: $SHARDLOAD_BIN, PATH, ../build)")
    ap.add_argument("--base", help="another build's shardload command, beside its libshardload.so*")
    ap.add_argument("--dir", default="/tmp/bench-fixed", help="where the checkpoints are made (default /tmp/bench-fixed)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved measured rounds (default 9)")
    ap.add_argument("--no-large", action="store_true", help="leave out the 1 GiB checkpoint")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one run may take (default 600)")
    ap.add_argument("--json", help="write every sample and the medians to this file")
    a = ap.parse_args()
    this = {"name": "this", "path": find_binary(a.bin)}
    builds = [this] + ([{"name": "base", "path": a.base, "libdir": os.path.dirname(os.path.abspath(a.base))}]
                       if a.base else [])
    os.makedirs(a.dir, exist_ok=True)
    ckpts = [("small", ["--size", "4MiB"])] + ([] if a.no_large else [("bf16-1GiB", ["--size", "1GiB"])])
    paths = {}
    for name, args in ckpts:
        paths[name] = os.path.join(a.dir, name + ".safetensors")
        if not os.path.exists(paths[name]):
            subprocess.run([this["path"], "synth", paths[name]] + args, check=True, stdout=subprocess.DEVNULL)
    configs = [("small", w, s) for w in (2, 4) for s in ("rank0", "every-rank")]
    if not a.no_large:
        configs.append(("bf16-1GiB", 2, "every-rank"))

    t0 = time.monotonic()
    for c, w, s in configs:  # warm-up: page cache, first touch
        for b in builds:
            run_load(b, paths[c], w, s, a.timeout)
    samples = {(b["name"], cfg): [] for b in builds for cfg in configs}
    loadavg = []
    for r in range(a.rounds):
        loadavg.append(float(open("/proc/loadavg").read().split()[0]))
        order = builds if r % 2 == 0 else builds[::-1]  # ABBA...: each goes first in turn
        for cfg in configs:
            for b in order:
                samples[(b["name"], cfg)].append(run_load(b, paths[cfg[0]], cfg[1], cfg[2], a.timeout))
    elapsed = time.monotonic() - t0

    def med(name, cfg, field):
        return statistics.median(x[field] for x in samples[(name, cfg)])

    print("fixed cost of `shardload load --nproc N`: %d rounds after a warm-up, medians; load average at the "
          "rounds' starts %.2f-%.2f (median %.2f); %.0f s in all" % (a.rounds, min(loadavg), max(loadavg),
                                                                   statistics.median(loadavg), elapsed))
    head = "| checkpoint | world | source | build | wall s | load s | fixed s | cpu s |"
    if a.base:
        head += " this/base wall | this/base fixed |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    table = []
    for cfg in configs:
        for b in builds:
            row = {"checkpoint": cfg[0], "world": cfg[1], "source": cfg[2], "build": b["name"]}
            for f in ("wall", "load", "fixed", "cpu"):
                row[f] = med(b["name"], cfg, f)
            line = "| %s | %d | %s | %s | %.3f | %.3f | %.3f | %.3f |" % (
                cfg[0], cfg[1], cfg[2], b["name"], row["wall"], row["load"], row["fixed"], row["cpu"])
            if a.base:
                if b["name"] == "this":
                    row["wall_ratio"] = row["wall"] / med("base", cfg, "wall")
                    row["fixed_ratio"] = row["fixed"] / med("base", cfg, "fixed")
                    line += " %.2f | %.2f |" % (row["wall_ratio"], row["fixed_ratio"])
                else:
                    line += " | |"
            table.append(row)
            print(line)
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"rounds": a.rounds, "loadavg": loadavg, "table": table,
                       "samples": [{"build": n, "config": list(cfg), "samples": v}
                                   for (n, cfg), v in samples.items()]}, out, indent=2)


if __name__ == "__main__":
    main()
