#!/usr/bin/env python3
"""Multi-rank load benchmark: shardload's scatter against Accelerate's broadcast algorithm,
rank-0 reading against every rank reading, with and without a cast, on local ranks.

Every configuration runs `shardload load PATH --nproc N --json --backend cpu --cpu-offload on`
(the command's own launcher: N processes, Gloo over loopback) once as a warm-up, then
--repeat times; the table shows medians. Python standard library only.

    bench_multirank.py /tmp/ck1g                # after: shardload synth /tmp/ck1g --size 1GiB --shards 4
    bench_multirank.py /tmp/ck256m --size 256MiB  # creates the checkpoint first if it is missing

Columns:
    wall s      launcher wall time (fork to the last rank's exit: start-up, rendezvous, load), median
    load s      the slowest rank's own load time (sl_state_stats seconds), median
    GB/s        checkpoint bytes / median wall time
    sent0/ckpt  bytes rank 0 sent / checkpoint bytes
    rss/(own+stg)  peak RSS of a rank / (its final shards + its staging), max over ranks and runs
Ratios, per world and cast: scatter/broadcast (rank 0's bytes sent, wall time) and
every-rank/rank0 (wall time, both with the scatter strategy).

With every-rank, each rank reads only its own byte ranges and nothing crosses the network, so
the strategy has no effect there: every-rank is measured once per world and cast.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def find_binary(given):
    if given:
        return given
    if os.environ.get("SHARDLOAD_BIN"):
        return os.environ["SHARDLOAD_BIN"]
    found = shutil.which("shardload")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in ("../build/shardload", "../build-release/shardload"):
        p = os.path.normpath(os.path.join(here, cand))
        if os.access(p, os.X_OK):
            return p
    sys.exit("bench_multirank: cannot find the shardload command; pass --bin PATH or set SHARDLOAD_BIN")


def run_load(binary, path, world, strategy, source, cast, staging, timeout):
    cmd = [binary, "load", path, "--nproc", str(world), "--json", "--backend", "cpu",
           "--cpu-offload", "on", "--strategy", strategy, "--source", source]
    if cast:
        cmd += ["--param-dtype", cast]
    if staging:
        cmd += ["--staging", staging]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit("bench_multirank: %s exited %d: %s" % (" ".join(cmd), p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def measure(binary, path, world, strategy, source, cast, repeat, staging, timeout):
    run_load(binary, path, world, strategy, source, cast, staging, timeout)  # warm-up: page cache, first touch
    walls, loads, rss_ratio, sent0, ckpt = [], [], 0.0, 0, 0
    for _ in range(repeat):
        j = run_load(binary, path, world, strategy, source, cast, staging, timeout)
        ckpt = j["checkpoint_bytes"]
        walls.append(j["wall_seconds"])
        loads.append(max(r["stats"].get("seconds", r["totals"]["seconds"]) for r in j["ranks"]))
        sent0 = j["ranks"][0]["stats"]["bytes_sent"]
        for r in j["ranks"]:
            own = r["totals"]["bytes"] + r["stats"]["staging_bytes"]
            if own:
                rss_ratio = max(rss_ratio, r["stats"]["peak_rss_bytes"] / own)
    wall = statistics.median(walls)
    return {
        "world": world, "strategy": strategy, "source": source, "cast": cast or "-",
        "wall": wall, "load": statistics.median(loads), "gbps": ckpt / wall / 1e9 if wall > 0 else 0.0,
        "sent0": sent0 / ckpt if ckpt else 0.0, "rss": rss_ratio, "walls": walls, "checkpoint_bytes": ckpt,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="checkpoint: .safetensors, index.json or directory")
    ap.add_argument("--bin", help="the shardload command (default: $SHARDLOAD_BIN, PATH, ../build)")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per configuration (default 3)")
    ap.add_argument("--worlds", default="2,4", help="world sizes, comma-separated (default 2,4)")
    ap.add_argument("--cast", default="F32", help="parameter dtype of the cast runs (default F32; '' to skip)")
    ap.add_argument("--size", help="create PATH with `shardload synth --shards 4` at this size if missing")
    ap.add_argument("--staging", help="staging budget per rank, e.g. 64MiB (default: the library's)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds one load may take (default 600)")
    ap.add_argument("--json", dest="json_out", help="also write every measurement to this JSON file")
    a = ap.parse_args()
    binary = find_binary(a.bin)
    if not os.path.exists(a.path):
        if not a.size:
            sys.exit("bench_multirank: %s does not exist; create it with `shardload synth %s --size 1GiB "
                     "--shards 4`, or pass --size" % (a.path, a.path))
        subprocess.run([binary, "synth", a.path, "--size", a.size, "--shards", "4"], check=True)
    worlds = [int(w) for w in a.worlds.split(",") if w]
    casts = [None] + ([a.cast] if a.cast else [])
    configs = [("scatter", "rank0"), ("broadcast", "rank0"), ("scatter", "every-rank")]

    t0 = time.monotonic()
    rows = []
    for world in worlds:
        for cast in casts:
            for strategy, source in configs:
                r = measure(binary, a.path, world, strategy, source, cast, a.repeat, a.staging, a.timeout)
                rows.append(r)
                print("  measured world %d %-9s %-10s cast %-4s: %.3f s" %
                      (world, strategy, source, r["cast"], r["wall"]), file=sys.stderr, flush=True)

    ckpt = rows[0]["checkpoint_bytes"] if rows else 0
    print("checkpoint %s: %d bytes (%.2f GiB); %d measured runs per row (median), warm page cache"
          % (a.path, ckpt, ckpt / 2**30, a.repeat))
    hdr = "%-5s  %-9s  %-10s  %-4s  %8s  %8s  %6s  %10s  %13s" % (
        "world", "strategy", "source", "cast", "wall s", "load s", "GB/s", "sent0/ckpt", "rss/(own+stg)")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print("%-5d  %-9s  %-10s  %-4s  %8.3f  %8.3f  %6.2f  %10.3f  %13.2f" % (
            r["world"], r["strategy"], r["source"], r["cast"], r["wall"], r["load"], r["gbps"], r["sent0"],
            r["rss"]))
    print()
    print("%-5s  %-4s  %18s  %17s  %17s" % ("world", "cast", "scatter/broadcast", "scatter/broadcast",
                                              "every-rank/rank0"))
    print("%-5s  %-4s  %18s  %17s  %17s" % ("", "", "bytes sent by 0", "wall time", "wall time"))
    for world in worlds:
        for cast in casts:
            c = cast or "-"
            pick = {(r["strategy"], r["source"]): r for r in rows if r["world"] == world and r["cast"] == c}
            sc, bc, er = pick[("scatter", "rank0")], pick[("broadcast", "rank0")], pick[("scatter", "every-rank")]
            bytes_ratio = sc["sent0"] / bc["sent0"] if bc["sent0"] else float("nan")
            print("%-5d  %-4s  %18.3f  %17.3f  %17.3f" % (world, c, bytes_ratio, sc["wall"] / bc["wall"],
                                                          er["wall"] / sc["wall"]))
    print("\ntotal benchmark time: %.0f s" % (time.monotonic() - t0))
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"path": a.path, "repeat": a.repeat, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
