#!/bin/bash
# bench_shm.sh: the whole command's wall time, `load --nproc W --collective shm` against
# `--collective gloo`, worlds 2 and 4, in interleaved rounds (the order flips each round), on
# a synthetic checkpoint; prints the medians and the ratio. The collectives' own throughput
# beside memcpy and a TCP stream is bench_wire (bench/bench_wire.c: --collectives gloo,shm).
#
#   bash bench/bench_shm.sh [SHARDLOAD_BIN] [SIZE] [ROUNDS]     # defaults: build/cpu/shardload 1GiB 7
set -euo pipefail
S=${1:-build/cpu/shardload}
SIZE=${2:-1GiB}
ROUNDS=${3:-7}
dir=$(mktemp -d "${TMPDIR:-/tmp}/bench_shm.XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$S" synth "$dir/ck.safetensors" --size "$SIZE" >/dev/null
"$S" load "$dir/ck.safetensors" --nproc 2 >/dev/null 2>&1 # warm the page cache
for r in $(seq 1 "$ROUNDS"); do
  for w in 2 4; do
    if [ $((r % 2)) -eq 1 ]; then order="shm gloo"; else order="gloo shm"; fi
    for c in $order; do
      t0=$(date +%s.%N)
      "$S" load "$dir/ck.safetensors" --nproc "$w" --collective "$c" --timeout 120 >/dev/null 2>"$dir/err" ||
        { echo "FAIL: --collective $c, world $w: $(cat "$dir/err")" >&2; exit 1; }
      t1=$(date +%s.%N)
      echo "$r $w $c $t0 $t1" >>"$dir/times"
    done
  done
done
python3 - "$dir/times" "$SIZE" "$ROUNDS" <<'PY'
import statistics, sys
d = {}
for line in open(sys.argv[1]):
    r, w, c, t0, t1 = line.split()
    d.setdefault((w, c), []).append(float(t1) - float(t0))
print(f"whole command, {sys.argv[2]} checkpoint, {sys.argv[3]} interleaved rounds (medians):")
for w in ("2", "4"):
    s, g = statistics.median(d[(w, "shm")]), statistics.median(d[(w, "gloo")])
    print(f"  world {w}: shm {s:.3f} s, gloo {g:.3f} s: gloo/shm {g / s:.2f}x "
          f"(min shm {min(d[(w, 'shm')]):.3f} s, gloo {min(d[(w, 'gloo')]):.3f} s)")
PY
