#!/usr/bin/env bash
# The GPU check: everything about the CUDA backend and the NCCL collective that needs a real
# NVIDIA GPU, run from a bundle (bench/gpu-bundle.sh) on a machine that cannot build one (no
# network, no Gloo, jansson, libsodium, xxhash, cmocka or pkg-config there): no build, no
# installer, only bash, coreutils, nvidia-smi and a python3 with torch + safetensors.
#
#   bash .gpu/bench/gpu-check.sh [--bundle DIR] [--smoke | --full] [--out DIR]
#     --bundle DIR   the bundle (default: the one this script lies in; from a source tree,
#                    bench/gpu-bundle.sh builds .gpu first, where the build dependencies are)
#     --smoke        only the smoke phase (at most SMOKE_S=180 s)
#     --full         only the full phase (at most FULL_S=420 s); default: both, smoke first
#     --out DIR      results (default ./gpu-check-out): summary.md, written row by row so a
#                    killed run still says what it saw, gpu-check.log, and gpu-check.tar.gz
#                    (every log, --json report, table and NCCL debug file), remade after each
#                    phase: three files
#     --size SIZE    the big checkpoint of the full phase (default 4GiB)
#     --python PY    the python with torch + safetensors (+ accelerate) (default python3)
#   env: WORK (scratch for checkpoints and logs, default a new folder in $TMPDIR, removed at
#        the end), SMOKE_S, FULL_S (the phases' bounds, seconds)
#
# Before the phases (each step bounded): the bundle's command starts here; the GPU (nvidia-smi:
# name, memory, bus id, compute mode; driver and CUDA version), the C runtime against what the
# bundle needs, python/torch/safetensors/accelerate versions, and libnccl.so.2: on the loader's
# path (LD_LIBRARY_PATH, the system), else in an NVIDIA wheel of the python (nvidia/nccl/lib or
# nvidia/cu13/lib, then put on LD_LIBRARY_PATH, which the NCCL module's dlopen reads); which one
# is used is a row.
# NCCL_DEBUG_FILE always points into the logs: an NCCL_DEBUG the image sets writes there, never
# into a --json report on stdout.
# Smoke: one world-1 load each with --collective local, --collective nccl and auto (auto not
# choosing nccl because NCCL cannot run is a FAIL), two ranks on one GPU over Gloo, auto with
# two ranks on one GPU (must take Gloo), the refusal of a forced NCCL for two ranks on one GPU
# (every rank fails, saying they "share device" (the core) or "share GPU" (the NCCL module),
# well within --timeout), each load with --timeout 20; the Python API on cuda (test_api.py:
# DLPack on torch's streams, the free of lent memory after a pending kernel); then the bundle's gpu tests
# (run-gpu-tests.sh: `ctest -L gpu` with the bundle's paths; a skip is a failure here).
# Full: the placement table on cuda (--cpu-offload on/off/infer x --offload-policy
# none/cpu/cpu-pinned x file dtype/F32) bit-exact against --backend cpu, two ranks over Gloo
# and one rank over NCCL bit-exact against cpu, the 4 GiB checkpoint from the page cache to
# the GPU against safetensors.torch.load_file(path, device="cuda") beside the read (dd) and
# pinned H2D (torch) bandwidth and the device memory peak (nvidia-smi sampling), and the Python
# drop-in for Accelerate on a cuda mesh (python/tests/test_accelerate_equiv.py --device cuda,
# bench/bench_accelerate.py at world 1). Exit 0 only when every check passed.
set -uo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
HERE=$(dirname "$SELF")

if [ "${1:-}" != --phase ]; then # ---- the outer run: arguments, preflight, then each phase ------
phases="smoke full" B="" OUT=$PWD/gpu-check-out SIZE=4GiB PYTHON=python3
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) B=${2:?--bundle needs a folder}; shift 2 ;;
    --smoke) phases=smoke; shift ;;
    --full) phases=full; shift ;;
    --out) OUT=${2:?--out needs a folder}; shift 2 ;;
    --size) SIZE=${2:?--size needs a size}; shift 2 ;;
    --python) PYTHON=${2:?--python needs an interpreter}; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT" || { echo "gpu-check: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
if [ -n "${WORK:-}" ]; then mkdir -p "$WORK" && WORK=$(cd "$WORK" && pwd); else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || { echo "gpu-check: no scratch folder" >&2; exit 1; }
  own_work=1
fi
LOGS=$WORK/logs
rm -rf "$LOGS" && mkdir -p "$LOGS" || { echo "gpu-check: cannot create $LOGS" >&2; exit 1; }
SUMMARY=$OUT/summary.md
rm -f "$OUT/summary.md" "$OUT/gpu-check.log" "$OUT/gpu-check.tar.gz"
export OUT WORK LOGS SUMMARY SIZE PYTHON
t0=$(date +%s)
failed=0
fi

# ---- shared by the outer run and the phases ------------------------------------------------------
say() { echo "gpu-check: $*" | tee -a "$OUT/gpu-check.log"; }
row() { # row CHECK OK|FAIL|INFO DETAIL: one line of summary.md's table, at once
  local d=${3//|/\\|}
  d=${d//$'\n'/ }
  echo "| $1 | $2 | ${d:0:600} |" >>"$SUMMARY"
  [ "$2" != FAIL ] || failed=1
  say "$1: $2 ${3:0:300}"
}
errline() { # the first error line of a load's stderr, else its last line
  { grep -m1 -E 'shardload:|error|Error' "$1" || tail -n 1 "$1"; } 2>/dev/null | head -c 400
}
secs_since() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}'; }
# jinfo FILE: "collective<TAB>reason<TAB>seconds<TAB>ranks<TAB>placements" of a --json report,
# or "ERR<TAB>why" when stdout is not one JSON document (an NCCL_DEBUG there, say)
jinfo() {
  "$PYTHON" - "$1" <<'PY'
import collections, json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    first = open(sys.argv[1], errors="replace").readline()[:120]
    print(f"ERR\tstdout is not one JSON document ({e}; it starts {first!r})")
    sys.exit()
ranks = d.get("ranks", [d])
c = collections.Counter((t["placement"], t["pinned"]) for r in ranks for t in r["tensors"])
where = ", ".join(f"{n} {p}{' pinned' if pin else ''}" for (p, pin), n in sorted(c.items()))
secs = d["wall_seconds"] if "ranks" in d else d["totals"]["seconds"]
print(f"{d['collective']['name']}\t{d['collective']['reason']}\t{secs:.3f}\t{len(ranks)}\t{where}")
PY
}
# sl_load TAG LIMIT ARGS...: one load with --json (stdout TAG.json, stderr TAG.err in the logs);
# sets rc, took (seconds) and, when it printed a report, coll, reason, wall, nranks, placed
sl_load() {
  local tag=$1 limit=$2 s0
  shift 2
  s0=$(date +%s%N)
  timeout -k 5 "$limit" "$SL" load "$@" --json >"$LOGS/$tag.json" 2>"$LOGS/$tag.err"
  rc=$?
  took=$(secs_since "$s0")
  coll="" reason="" wall="" nranks="" placed=""
  if [ -s "$LOGS/$tag.json" ]; then IFS=$'\t' read -r coll reason wall nranks placed < <(jinfo "$LOGS/$tag.json"); fi
  if [ "$coll" = ERR ] && [ $rc -eq 0 ]; then rc=3; fi # a report nobody can read is a failure
}
load_failed() { # why the last sl_load failed, for a row
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "ran past its bound (${took} s): a hang"
  elif [ "$coll" = ERR ]; then echo "$reason"
  else echo "exit $rc in ${took} s: $(errline "$LOGS/$1.err")"; fi
}
left() { echo $(( deadline - $(date +%s) )); } # seconds this phase has left
bound() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo $(( l > 5 ? l - 5 : 1 )); }

# ================================ the smoke phase ==================================================
phase_smoke() {
  local ck=$WORK/ck64
  rm -rf "$ck"
  "$SL" synth "$ck" --size 64MiB --shards 2 --seed 5 >/dev/null 2>"$LOGS/synth64.err" ||
    { row "synth 64 MiB" FAIL "$(errline "$LOGS/synth64.err")"; return; }
  # world 1: forced local, forced nccl, auto
  sl_load w1-local "$(bound 60)" "$ck" --backend cuda --collective local --timeout 20
  if [ $rc -eq 0 ] && [ "$coll" = local ]; then row "cuda, world 1, --collective local" OK "$placed; ${wall} s"
  elif [ $rc -eq 0 ]; then row "cuda, world 1, --collective local" FAIL "the report names collective $coll"
  else row "cuda, world 1, --collective local" FAIL "$(load_failed w1-local)"; fi
  sl_load w1-nccl "$(bound 60)" "$ck" --backend cuda --collective nccl --timeout 20
  if [ $rc -eq 0 ] && [ "$coll" = nccl ]; then row "cuda, world 1, --collective nccl" OK "$placed; ${wall} s"
  elif [ $rc -eq 0 ]; then row "cuda, world 1, --collective nccl" FAIL "the report names collective $coll"
  else row "cuda, world 1, --collective nccl" FAIL "$(load_failed w1-nccl)"; fi
  sl_load w1-auto "$(bound 60)" "$ck" --backend cuda --timeout 20
  if [ $rc -ne 0 ]; then row "cuda, world 1, auto" FAIL "$(load_failed w1-auto)"
  elif [ "$coll" != nccl ] && [[ $reason == *"cannot run nccl"* || $reason == *libnccl* ]]; then
    row "cuda, world 1, auto" FAIL "fell back to $coll because NCCL cannot run: $reason"
  else row "cuda, world 1, auto" OK "$coll ($reason); ${wall} s"; fi
  # two ranks on GPU 0 (or one GPU each where there are two)
  sl_load w2-gloo "$(bound 90)" "$ck" --nproc 2 --backend cuda --collective gloo --timeout 20
  if [ $rc -eq 0 ] && [ "$coll" = gloo ] && [ "$nranks" = 2 ]; then row "2 ranks, $NGPU GPU(s), --collective gloo" OK "$placed; ${wall} s"
  elif [ $rc -eq 0 ]; then row "2 ranks, $NGPU GPU(s), --collective gloo" FAIL "collective $coll, $nranks ranks"
  else row "2 ranks, $NGPU GPU(s), --collective gloo" FAIL "$(load_failed w2-gloo)$COMPUTE_NOTE"; fi
  sl_load w2-auto "$(bound 90)" "$ck" --nproc 2 --backend cuda --timeout 20
  local want=shm # two ranks on one GPU: host staging, through shared memory on one host
  [ "$NGPU" -lt 2 ] || want=nccl
  if [ $rc -eq 0 ] && [ "$coll" = $want ]; then row "2 ranks, $NGPU GPU(s), auto" OK "$coll ($reason); ${wall} s"
  elif [ $rc -eq 0 ]; then row "2 ranks, $NGPU GPU(s), auto" FAIL "chose $coll, want $want: $reason"
  else row "2 ranks, $NGPU GPU(s), auto" FAIL "$(load_failed w2-auto)"; fi
  # a forced NCCL with two ranks: one GPU: refused on every rank, saying why, in time
  local s0 msg
  s0=$(date +%s%N)
  timeout -k 5 "$(bound 90)" "$SL" load "$ck" --nproc 2 --backend cuda --collective nccl --timeout 20 -v \
    >"$LOGS/w2-nccl.out" 2>"$LOGS/w2-nccl.err"
  rc=$?
  took=$(secs_since "$s0")
  if [ "$NGPU" -ge 2 ]; then
    if [ $rc -eq 0 ]; then row "2 ranks, $NGPU GPUs, --collective nccl" OK "${took} s"
    else row "2 ranks, $NGPU GPUs, --collective nccl" FAIL "exit $rc in ${took} s: $(errline "$LOGS/w2-nccl.err")"; fi
  else
    msg=$(grep -m1 -E 'share (device|GPU)' "$LOGS/w2-nccl.err" | head -c 300)
    local every=1 r
    # -v relays every rank's error line, each tagged "<STATUS>: rank R: " by its rank
    for r in 0 1; do grep -qE "SL_ERR_[A-Z_]*: rank $r: .*share (device|GPU)" "$LOGS/w2-nccl.err" || every=0; done
    if [ $rc -eq 1 ] && [ -n "$msg" ] && [ $every = 1 ] && awk -v t="$took" 'BEGIN {exit !(t < 30)}'; then
      row "2 ranks, 1 GPU, --collective nccl refused" OK "exit 1 on every rank in ${took} s: $msg"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      row "2 ranks, 1 GPU, --collective nccl refused" FAIL "ran past its bound (${took} s): a hang"
    else
      row "2 ranks, 1 GPU, --collective nccl refused" FAIL "exit $rc in ${took} s, every rank said 'share device/GPU': $([ $every = 1 ] && echo yes || echo no): $(errline "$LOGS/w2-nccl.err")"
    fi
  fi
  rm -rf "$ck"
  # the Python API on the GPU: DLPack lending on torch's streams, and the free of lent device
  # memory ordered after a kernel still pending on the consumer's stream (cuda_release_order;
  # its skip is a FAIL here)
  local p0 prc plimit
  p0=$(date +%s)
  plimit=$(bound 120)
  SHARDLOAD_LIBRARY=$LIB PYTHONPATH=$B/python timeout -k 10 "$plimit" \
    "$PYTHON" "$B/python/tests/test_api.py" --tmp "$WORK/api" >"$LOGS/python-api.log" 2>&1
  prc=$?
  if [ $prc -eq 0 ] && grep -q '^cuda release order: ok' "$LOGS/python-api.log"; then
    row "python API on cuda (test_api.py)" OK "$(( $(date +%s) - p0 )) s: $(grep -E '^(dlpack|cuda release|test_api)' "$LOGS/python-api.log" | tr '\n' ' ')"
  else
    row "python API on cuda (test_api.py)" FAIL "exit $prc$([ $prc -eq 124 ] && echo " (past $plimit s)"): $(grep -m1 -E 'skipped|Error|error|FAIL' "$LOGS/python-api.log" | head -c 300)"
  fi
  rm -rf "$WORK/api"
  # the bundle's gpu tests, in what the phase has left
  local limit
  limit=$(( $(left) - 10 ))
  if [ "$limit" -lt 20 ]; then row "gpu tests (ctest -L gpu)" FAIL "no time left in the smoke phase"; return; fi
  s0=$(date +%s%N)
  SL_GPU_TEST_TIMEOUT=$limit timeout -k 5 $((limit + 5)) bash "$B/run-gpu-tests.sh" "$WORK/gpu-tests" >"$LOGS/gpu-tests.txt" 2>&1
  rc=$?
  cp "$WORK"/gpu-tests/*.log "$LOGS/" 2>/dev/null
  local res
  res=$(grep -E '^(PASS|SKIP|FAIL) ' "$LOGS/gpu-tests.txt" | tr '\n' ';')
  if [ $rc -eq 0 ]; then row "gpu tests (ctest -L gpu)" OK "$(secs_since "$s0") s: $res"
  else row "gpu tests (ctest -L gpu)" FAIL "exit $rc$([ $rc -eq 77 ] && echo ' (a skip: the GPU was not usable)'): $res"; fi
  rm -rf "$WORK/gpu-tests"
}

# ================================ the full phase ===================================================
# same_load TAG ARGS...: the load on cpu and on cuda, dumps compared byte for byte; prints the
# cuda load's placements, collective and seconds. $cuda_args: for the cuda load only.
cuda_args=()
same_load() {
  local tag=$1
  shift
  local d=$WORK/$tag b f n=0 bad=""
  rm -rf "$d"
  for b in cpu cuda; do
    local extra=()
    [ $b = cpu ] || extra=("${cuda_args[@]}")
    sl_load "$tag-$b" "$(bound 120)" "$@" "${extra[@]}" --backend $b --dump "$d/$b" --timeout 60
    if [ $rc -ne 0 ]; then
      echo "$b: $(load_failed "$tag-$b")"
      rm -rf "$d"
      return 1
    fi
  done
  for f in "$d"/cpu/rank-*.safetensors; do
    [ -f "$f" ] || continue
    cmp -s "$f" "$d/cuda/$(basename "$f")" || bad="$bad $(basename "$f")"
    n=$((n + 1))
  done
  rm -rf "$d"
  [ $n -gt 0 ] || { echo "no dump written"; return 1; }
  [ -z "$bad" ] || { echo "differs between cpu and cuda:$bad"; return 1; }
  echo "$placed; $coll; ${wall} s"
}

phase_full() {
  local small=$WORK/small res off pol dt args failed_place=""
  rm -rf "$small"
  "$SL" synth "$small" --size 256MiB --shards 2 >/dev/null 2>"$LOGS/synth256.err" ||
    { row "synth 256 MiB" FAIL "$(errline "$LOGS/synth256.err")"; return; }
  {
    echo "## Placement table: --backend cuda, 256 MiB BF16 in 2 shards, dumps == --backend cpu"
    echo
    echo "| --cpu-offload | --offload-policy | --param-dtype | cuda placement (tensors); collective; seconds | == cpu |"
    echo "|---|---|---|---|---|"
  } >"$LOGS/placement.md"
  for off in on off infer; do
    for pol in none cpu cpu-pinned; do
      for dt in file F32; do
        [ $dt = F32 ] && [ $pol = cpu ] && continue # casts: one row per placement is enough
        args=(--cpu-offload "$off" --offload-policy "$pol")
        [ $dt = F32 ] && args+=(--param-dtype F32)
        if res=$(same_load "place-$off-$pol-$dt" "$small" "${args[@]}"); then
          echo "| $off | $pol | $dt | $res | yes |" >>"$LOGS/placement.md"
        else
          echo "| $off | $pol | $dt | $res | **NO** |" >>"$LOGS/placement.md"
          failed_place="$failed_place $off/$pol/$dt"
        fi
      done
    done
  done
  if [ -z "$failed_place" ]; then row "placement table" OK "15 loads, every dump == cpu (placement.md)"
  else row "placement table" FAIL "differs or fails:$failed_place (placement.md)"; fi
  if res=$(same_load two-gloo "$small" --nproc 2 --collective gloo); then row "2 ranks, gloo, dumps == cpu" OK "$res"
  else row "2 ranks, gloo, dumps == cpu" FAIL "$res"; fi
  if res=$(same_load two-gloo-cast "$small" --nproc 2 --collective gloo --param-dtype F32 --cpu-offload off); then
    row "2 ranks, gloo, F32 cast, dumps == cpu" OK "$res"
  else row "2 ranks, gloo, F32 cast, dumps == cpu" FAIL "$res"; fi
  cuda_args=(--collective nccl)
  if res=$(same_load one-nccl "$small"); then row "1 rank, nccl, dumps == cpu" OK "$res"
  else row "1 rank, nccl, dumps == cpu" FAIL "$res"; fi
  cuda_args=()
  rm -rf "$small"
  big_load
  python_dropin
}

# ~4 GiB from the page cache to GPU memory: shardload against safetensors' load_file
big_load() {
  local big=$WORK/big.safetensors bytes base_mib read_gbs sampler rep sl_peak th_peak trc
  rm -f "$big"
  timeout "$(bound 120)" "$SL" synth "$big" --size "$SIZE" >/dev/null 2>"$LOGS/synth-big.err" ||
    { row "$SIZE page cache -> GPU" FAIL "synth: $(errline "$LOGS/synth-big.err")"; rm -f "$big"; return; }
  bytes=$(stat -c %s "$big")
  cat "$big" >/dev/null # warm the page cache
  sample_mem() { while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >>"$1" 2>/dev/null; sleep 0.05; done; }
  base_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1)
  read_gbs=$(dd if="$big" of=/dev/null bs=16M 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
  : >"$LOGS/mem-shardload.txt"
  sample_mem "$LOGS/mem-shardload.txt" & sampler=$!
  for rep in 1 2 3; do
    sl_load "big-shardload-$rep" "$(bound 120)" "$big" --backend cuda --timeout 60
    [ $rc -eq 0 ] || { row "$SIZE shardload" FAIL "rep $rep: $(load_failed "big-shardload-$rep")"; break; }
  done
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  sl_peak=$(sort -n "$LOGS/mem-shardload.txt" | tail -n 1)
  : >"$LOGS/mem-torch.txt"
  sample_mem "$LOGS/mem-torch.txt" & sampler=$!
  timeout "$(bound 150)" "$PYTHON" - "$big" >"$LOGS/big-torch.json" 2>"$LOGS/big-torch.err" <<'PY'
import json, sys, time, torch
from safetensors.torch import load_file
path = sys.argv[1]
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
res = {}
times = []
for rep in range(3):
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    sd = load_file(path, device="cuda")
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    res["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    del sd
    torch.cuda.empty_cache()
res["seconds"] = times
res["bytes"] = nbytes
# pinned host to device bandwidth, 1 GiB, best of 3
src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
h2d = []
for rep in range(3):
    torch.cuda.synchronize(); t = time.perf_counter()
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    h2d.append((1 << 30) / (time.perf_counter() - t) / 1e9)
res["pinned_h2d_gb_per_s"] = max(h2d)
print(json.dumps(res))
PY
  trc=$?
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  th_peak=$(sort -n "$LOGS/mem-torch.txt" | tail -n 1)
  "$PYTHON" - "$LOGS" "$bytes" "$base_mib" "$sl_peak" "$th_peak" "$read_gbs" "$trc" >"$LOGS/big.md" <<'PY'
import glob, json, statistics, sys
logs, nbytes, base, slp, thp, read, trc = sys.argv[1:8]
nbytes = int(nbytes); base = float(base or 0)
runs = []
for f in sorted(glob.glob(f"{logs}/big-shardload-*.json")):
    try:
        runs.append(json.load(open(f)))
    except Exception:
        pass
sl_s = [r["totals"]["seconds"] for r in runs]
print(f"## {nbytes / 2**30:.2f} GiB BF16 checkpoint, page cache warm, world 1, one GPU\n")
print("| | seconds (median of 3) | GB/s | device memory peak (nvidia-smi, above idle) |")
print("|---|---|---|---|")
if sl_s:
    m = statistics.median(sl_s)
    st = runs[-1]["stats"]
    print(f"| shardload load --backend cuda | {m:.3f} | {nbytes / m / 1e9:.2f} | {float(slp or 0) - base:.0f} MiB "
          f"(staging {st.get('device_staging_bytes', 0) / 2**20:.0f} MiB) |")
try:
    t = json.load(open(f"{logs}/big-torch.json"))
    m2 = statistics.median(t["seconds"])
    print(f"| safetensors.torch.load_file(device=\"cuda\") | {m2:.3f} | {nbytes / m2 / 1e9:.2f} | "
          f"{float(thp or 0) - base:.0f} MiB (torch max allocated {t['peak_allocated_bytes'] / 2**20:.0f} MiB) |")
    print(f"\nread (dd, page cache): {read}; pinned H2D (torch, 1 GiB): {t['pinned_h2d_gb_per_s']:.2f} GB/s")
    if sl_s:
        print(f"\nshardload / safetensors speed: {m2 / statistics.median(sl_s):.2f}x")
except Exception as e:
    print(f"\nsafetensors run failed (exit {trc}): {e}; see big-torch.err")
print(f"\nidle device memory before the runs: {base:.0f} MiB; checkpoint {nbytes / 2**20:.0f} MiB")
PY
  if [ -s "$LOGS/big-shardload-3.json" ] && [ $trc -eq 0 ]; then
    row "$SIZE page cache -> GPU" OK "$(grep -E '^\| shardload|^shardload /|^read' "$LOGS/big.md" | tr '\n' ' ' | head -c 500)"
  else
    row "$SIZE page cache -> GPU" FAIL "safetensors exit $trc; see big-shardload-*.err, big-torch.err: $(tail -n 1 "$LOGS/big-torch.err" 2>/dev/null | head -c 200)"
  fi
  rm -f "$big"
}

# The Python drop-in on the GPU, world 1: the equivalence test of CI on a cuda mesh, then the
# benchmark against Accelerate's function (device placement, then pinned CPU offload)
python_dropin() {
  if ! "$PYTHON" -c 'import accelerate, torch.distributed.fsdp' 2>/dev/null; then
    row "python drop-in (cuda mesh)" FAIL "$PYTHON cannot import accelerate and torch.distributed.fsdp"
    return
  fi
  local p0 prc brc off limit
  p0=$(date +%s)
  limit=$(bound 240)
  SHARDLOAD_LIBRARY=$LIB PYTHONPATH=$B/python timeout -k 10 "$limit" \
    "$PYTHON" "$B/python/tests/test_accelerate_equiv.py" --world 1 --device cuda --tmp "$WORK/python" \
    >"$LOGS/python-dropin.log" 2>&1
  prc=$?
  if [ $prc -eq 0 ] && grep -q 'checks on rank 0 passed' "$LOGS/python-dropin.log"; then
    row "python drop-in (cuda mesh)" OK "$(( $(date +%s) - p0 )) s: $(grep -E '^backend|checks on rank 0|skipped' "$LOGS/python-dropin.log" | tr '\n' ' ')"
  else
    row "python drop-in (cuda mesh)" FAIL "exit $prc$([ $prc -eq 124 ] && echo " (past $limit s)"); python-dropin.log: $(grep -m1 -E 'Error|error' "$LOGS/python-dropin.log" | head -c 300)"
  fi
  rm -rf "$WORK/python"
  for off in none cpu+pin; do
    limit=$(bound 120)
    SHARDLOAD_LIBRARY=$LIB PYTHONPATH=$B/python timeout -k 10 "$limit" \
      "$PYTHON" "$B/bench/bench_accelerate.py" --device cuda --worlds 1 --offload "$off" --repeat 2 \
      --dir "$WORK/bench-accel" --json "$LOGS/bench-accelerate-$off.json" >"$LOGS/bench-accelerate-$off.log" 2>&1
    brc=$?
    row "python bench (world 1, cuda, offload $off)" "$([ $brc -eq 0 ] && echo OK || echo FAIL)" \
      "exit $brc; $(grep -m1 -E '^\| 1 \| dict' "$LOGS/bench-accelerate-$off.log" | head -c 200) $([ $brc -eq 0 ] || grep -m1 -E 'Error|error' "$LOGS/bench-accelerate-$off.log" | head -c 200)"
  done
  rm -rf "$WORK/bench-accel"
}

if [ "${1:-}" = --phase ]; then # ---- one phase, under the outer run's timeout ---------------------
  failed=0
  deadline=$(( $(date +%s) + PHASE_S ))
  "phase_$2"
  exit $failed
fi

# ================================ the outer run ====================================================
archive() { # every log into one archive in OUT (made anew: a killed phase still has the last one)
  tar -czf "$OUT/gpu-check.tar.gz.part" -C "$WORK" logs 2>/dev/null && mv -f "$OUT/gpu-check.tar.gz.part" "$OUT/gpu-check.tar.gz"
}
finish() { # finish STATUS [WHY]
  [ -z "${2:-}" ] || { echo; echo "stopped: $2"; } >>"$SUMMARY"
  local f
  for f in placement.md big.md; do [ -f "$LOGS/$f" ] && { echo; cat "$LOGS/$f"; } >>"$SUMMARY"; done
  { echo; echo "total: $(( $(date +%s) - t0 )) s; result: $([ "$1" = 0 ] && echo PASS || echo FAIL)"; } >>"$SUMMARY"
  archive
  say "done in $(( $(date +%s) - t0 )) s: $([ "$1" = 0 ] && echo 'every check passed' || echo 'SOME CHECKS FAILED') (summary: $SUMMARY)"
  [ -z "${own_work:-}" ] || rm -rf "$WORK"
  exit "$1"
}
die() { row stopped FAIL "$*"; finish 1 "$*"; }

{
  echo "# GPU check, $(date -u +%FT%TZ), $(uname -n)"
  echo
  echo "| check | result | detail |"
  echo "|---|---|---|"
} >"$SUMMARY"

# ---- the bundle ------------------------------------------------------------------------------
if [ -z "$B" ] && [ -f "$HERE/../BUNDLE" ]; then B=$(cd "$HERE/.." && pwd); fi
if [ -z "$B" ]; then # a source tree: make the bundle first (needs the build dependencies)
  say "no --bundle: building one from $(dirname "$HERE") with bench/gpu-bundle.sh"
  b0=$(date +%s)
  bash "$HERE/gpu-bundle.sh" "$(dirname "$HERE")/.gpu" >"$LOGS/bundle.log" 2>&1 ||
    die "cannot build the bundle here ($(grep -m1 'gpu-bundle:' "$LOGS/bundle.log" | head -c 300)); build it where the build dependencies are (bash bench/gpu-bundle.sh), carry .gpu here, and run bash .gpu/bench/gpu-check.sh --bundle .gpu"
  B=$(dirname "$HERE")/.gpu
  say "bundle built in $(( $(date +%s) - b0 )) s"
fi
[ -d "$B" ] && B=$(cd "$B" && pwd)
[ -f "$B/BUNDLE" ] || die "$B is not a bundle (no BUNDLE file): make one with bash bench/gpu-bundle.sh [DIR]"
SL=$B/bin/shardload
LIB=$(ls "$B"/lib/libshardload.so.* 2>/dev/null | head -n 1)
needs=$(sed -n 's/^needs: \([^(]*\).*/\1/p' "$B/BUNDLE" | sed 's/ *$//')
version=$(timeout 20 "$SL" --version 2>&1) ||
  die "the bundle's command does not start here: $version (the bundle needs ${needs:-?}; this machine: $(getconf GNU_LIBC_VERSION 2>/dev/null))"
export B SL LIB
row bundle OK "$B: $version; $(sed -n 's/^commit: /commit /p' "$B/BUNDLE"), $(sed -n 's/^built on: /built on /p' "$B/BUNDLE"), $(sed -n 's/^cuda architectures: /sm_/p' "$B/BUNDLE"); needs $needs; this machine: $(getconf GNU_LIBC_VERSION 2>/dev/null)"
# logs of the vendor libraries go to files, never into a --json report on stdout
export NCCL_DEBUG_FILE=$LOGS/nccl.%h.%p.log

# ---- the GPU -------------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null; then
  "$SL" synth "$WORK/probe.safetensors" --size 1MiB >/dev/null 2>&1
  why=$(timeout 30 "$SL" load "$WORK/probe.safetensors" --backend cuda 2>&1 >/dev/null | head -c 300)
  die "no GPU here: nvidia-smi not found (no NVIDIA driver); the cuda backend says: ${why:-nothing}. Run this on the GPU machine"
fi
gpus=$(timeout 30 nvidia-smi --query-gpu=index,name,memory.total,pci.bus_id,compute_mode --format=csv,noheader 2>&1) ||
  die "no GPU here: nvidia-smi finds no usable GPU: $gpus"
[ -n "$gpus" ] || die "no GPU here: nvidia-smi lists none"
NGPU=$(echo "$gpus" | wc -l)
COMPUTE_NOTE=""
if echo "$gpus" | grep -qi 'exclusive'; then COMPUTE_NOTE=" (compute mode exclusive: one process per GPU, so two ranks on one GPU cannot run)"; fi
export NGPU COMPUTE_NOTE
row GPU OK "$NGPU: $(echo "$gpus" | tr '\n' ';')$COMPUTE_NOTE"
driver=$(timeout 30 nvidia-smi 2>/dev/null | grep -m1 -o 'Driver Version: [0-9.]*.*CUDA Version: [0-9.]*' | tr -s ' ')
row driver "$([ -n "$driver" ] && echo OK || echo FAIL)" "${driver:-nvidia-smi names no driver}; $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
"$SL" synth "$WORK/probe.safetensors" --size 1MiB >/dev/null 2>&1
if ! why=$(timeout 60 "$SL" load "$WORK/probe.safetensors" --backend cuda --collective local --timeout 20 2>&1 >"$LOGS/probe.out"); then
  row "cuda backend" FAIL "$why"
  die "the cuda backend cannot run here: $why"
fi
row "cuda backend" OK "$(grep -m1 -E 'device|backend' "$LOGS/probe.out" | head -c 300)"

# ---- python, torch ---------------------------------------------------------------------------------
"$PYTHON" -c 'import json' 2>/dev/null || die "no $PYTHON here (it reads the --json reports; give --python PY)"
pyv=$(timeout 90 "$PYTHON" - 2>&1 <<'PY'
import platform
out = [f"python {platform.python_version()}"]
import torch
try:
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:
    nccl = f"? ({type(e).__name__})"
out.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available {torch.cuda.is_available()}, "
           f"{torch.cuda.device_count()} device(s), NCCL {nccl})")
for m in ("safetensors", "accelerate", "transformers"):
    try:
        out.append(f"{m} {__import__(m).__version__}")
    except Exception as e:
        out.append(f"{m} missing ({type(e).__name__})")
print(", ".join(out))
PY
)
prc=$?
pyv=$(echo "$pyv" | tail -n 1)
if [ $prc -eq 0 ] && [[ $pyv != *"safetensors missing"* ]]; then row python OK "$PYTHON: $pyv"
else row python FAIL "$PYTHON: ${pyv:-exit $prc} (the full phase needs torch and safetensors)"; fi

# ---- libnccl.so.2: the loader's path, else the python's nvidia-nccl wheel -------------------------
nccl="" how=""
IFS=: read -ra llp <<<"${LD_LIBRARY_PATH:-}"
for d in "${llp[@]}"; do
  [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && { nccl=$d/libnccl.so.2; how="LD_LIBRARY_PATH"; break; }
done
if [ -z "$nccl" ]; then
  ldc=$(command -v ldconfig || echo /sbin/ldconfig)
  nccl=$("$ldc" -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}')
  [ -z "$nccl" ] || how="the system (ld.so.cache)"
fi
if [ -z "$nccl" ]; then
  # nvidia-nccl-cu12/cu13 put it in nvidia/nccl/lib (2.27 and 2.32 both); CUDA 13's merged
  # wheels use nvidia/cu13/lib. nvidia is a namespace package that may span several site
  # directories: look in each, the known places first, then any nvidia/*/lib.
  wheel=$(timeout 60 "$PYTHON" - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
for pattern in ("nccl/lib", "cu13/lib", "cu12/lib", "*/lib"):
    for root in roots:
        for d in sorted(glob.glob(os.path.join(root, pattern))):
            if os.path.isfile(os.path.join(d, "libnccl.so.2")):
                print(d)
                raise SystemExit(0)
PY
)
  if [ -n "$wheel" ] && [ -e "$wheel/libnccl.so.2" ]; then
    nccl=$wheel/libnccl.so.2
    how="the python's NCCL wheel ($wheel), put on LD_LIBRARY_PATH"
    export LD_LIBRARY_PATH=$wheel${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
fi
if [ -n "$nccl" ]; then
  nv=$(timeout 30 "$PYTHON" -c 'import ctypes, sys
l = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int()
l.ncclGetVersion(ctypes.byref(v)); v = v.value
print(f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v // 100 % 10}.{v % 100}")' "$nccl" 2>&1 | tail -n 1)
  row "libnccl.so.2" OK "$nccl (from $how), NCCL $nv"
else
  row "libnccl.so.2" FAIL "not on the loader's path (LD_LIBRARY_PATH, ld.so.cache) nor in an NVIDIA wheel of $PYTHON (nvidia/nccl/lib, nvidia/cu13/lib): every NCCL check fails"
fi

# ---- the phases, each under its bound -----------------------------------------------------------
for ph in $phases; do
  case $ph in smoke) limit=${SMOKE_S:-180} ;; full) limit=${FULL_S:-420} ;; esac
  say "phase $ph (at most $limit s)"
  p0=$(date +%s)
  PHASE_S=$limit timeout -k 15 "$limit" bash "$SELF" --phase "$ph"
  prc=$?
  if [ $prc -eq 124 ] || [ $prc -eq 137 ]; then row "phase $ph" FAIL "ran past $limit s and was stopped; the rows above are what it saw"
  elif [ $prc -ne 0 ]; then row "phase $ph" FAIL "$(( $(date +%s) - p0 )) s, some checks failed"
  else row "phase $ph" OK "$(( $(date +%s) - p0 )) s"; fi
  archive
done
finish "$failed"
