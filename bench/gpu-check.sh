#!/usr/bin/env bash
# The GPU check (issue 8): everything about the CUDA backend and the NCCL collective that needs
# a real NVIDIA GPU, on a machine with one (an H200; torch with safetensors in the system
# python; no network). Done well within ten minutes. Results under $OUT (default
# ./gpu-check-out): summary.md (the figures), one log per step, the --json of every load.
#
#   bash bench/gpu-check.sh                     build, then every step
#   OUT=/tmp/x BUILD=build/gpu bash bench/gpu-check.sh
#   SIZE=4GiB PYTHON=python3 ...                the big checkpoint's size, the python with torch
#   SKIP_BUILD=1 ...                            reuse $BUILD as it is (a tree built for sm_90)
#
# Steps: 1 build with -DSHARDLOAD_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90; 2 ctest -L gpu
# (a SKIPPED test is a failure here: there is a GPU); 3 the placement table on the cuda backend
# (--cpu-offload on/off/infer x --offload-policy none/cpu/cpu-pinned, --dump) compared byte for
# byte with the same load on --backend cpu; 4 two ranks on the one GPU over Gloo staging, same
# comparison, and what NCCL does with two ranks on one GPU (it refuses: recorded, bounded);
# 5 a ~4 GiB checkpoint from the page cache to GPU memory, shardload against
# safetensors.torch.load_file(path, device="cuda"), beside the read and pinned H2D bandwidth,
# with the device memory peak (nvidia-smi sampling); 6 the Python drop-in for Accelerate on a
# cuda mesh against Accelerate's own function (python/tests/test_accelerate_equiv.py --device
# cuda, world 1) and bench/bench_accelerate.py at world 1. Exit 0 only when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SRC=$PWD
OUT=${OUT:-$SRC/gpu-check-out}
BUILD=${BUILD:-$SRC/build/gpu-check}
SIZE=${SIZE:-4GiB}
PYTHON=${PYTHON:-python3}
WORK=${WORK:-${TMPDIR:-/tmp}/gpu-check-work} # checkpoints and dumps: large, deleted after use
mkdir -p "$OUT/loads" "$WORK" || { echo "gpu-check: cannot create $OUT and $WORK" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
SUMMARY=$OUT/summary.md
failed=0
t0=$(date +%s)

say() { echo "gpu-check: $*" | tee -a "$OUT/gpu-check.log"; }
die() { # the checks so far still go into summary.md
  say "FAIL: $*"
  if [ -f "$SUMMARY.rows" ]; then
    { echo "| check | result | detail |"; echo "|---|---|---|"; cat "$SUMMARY.rows"; echo; echo "stopped: $*"; } >>"$SUMMARY"
    rm -f "$SUMMARY.rows"
  fi
  exit 1
}
check() { # check NAME OK|FAIL DETAIL: one row of the summary
  echo "| $1 | $2 | $3 |" >>"$SUMMARY.rows"
  [ "$2" = OK ] || failed=1
  say "$1: $2 $3"
}

# ---- 0. preflight: fail fast, and say what is missing --------------------------------------
command -v nvidia-smi >/dev/null || die "no nvidia-smi: this machine has no NVIDIA driver; run bench/gpu-check.sh on a machine with an NVIDIA GPU (tests needing no GPU: bash scripts/test.sh)"
gpus=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version,pci.bus_id --format=csv,noheader 2>&1) ||
  die "nvidia-smi finds no usable GPU ($gpus); run this on a machine with an NVIDIA GPU"
[ -n "$gpus" ] || die "nvidia-smi lists no GPU; run this on a machine with an NVIDIA GPU"
ngpu=$(echo "$gpus" | wc -l)
missing=()
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  for tool in cmake pkg-config cc c++; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || missing+=(nvcc)
fi
"$PYTHON" -c 'import torch, safetensors' 2>/dev/null || missing+=("$PYTHON with torch + safetensors")
[ ${#missing[@]} -eq 0 ] || die "missing here: ${missing[*]} (no network: they must come with the machine)"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
{
  echo "# GPU check, $(date -u +%FT%TZ)"
  echo
  echo '```'
  echo "$gpus"
  nvcc --version 2>/dev/null | tail -n 2
  "$PYTHON" -c 'import torch, safetensors; print("torch", torch.__version__, "cuda", torch.version.cuda, "safetensors", safetensors.__version__)'
  echo "cpu: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -r)"
  echo '```'
  echo
} >"$SUMMARY"
: >"$SUMMARY.rows"
say "$ngpu GPU(s): $(echo "$gpus" | head -n 1); results in $OUT"

# ---- 1. build for sm_90 --------------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  b0=$(date +%s)
  if cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDLOAD_WITH_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1; then
    check build OK "$(( $(date +%s) - b0 )) s, sm_90 ($BUILD)"
  else
    check build FAIL "see build.log: $(grep -m1 -E 'error' "$OUT/build.log")"
    die "nothing to check without a build"
  fi
fi
SL=$BUILD/shardload
if [ ! -x "$SL" ] || [ ! -f "$BUILD/libshardload-cuda.so" ] || [ ! -f "$BUILD/libshardload-nccl.so" ]; then
  die "$BUILD lacks shardload or the CUDA/NCCL modules"
fi

# ---- 2. the gpu-labelled tests --------------------------------------------------------------
(cd "$BUILD" && timeout 300 ctest -L gpu --output-on-failure --timeout 240) >"$OUT/ctest-gpu.log" 2>&1
rc=$?
line=$(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" | tail -n 1)
if [ $rc -eq 0 ] && ! grep -q 'Skipped' "$OUT/ctest-gpu.log" && grep -q '100% tests passed' "$OUT/ctest-gpu.log"; then
  check "ctest -L gpu" OK "$line"
else
  check "ctest -L gpu" FAIL "exit $rc, $line (a skip means the GPU was not usable); see ctest-gpu.log"
fi

# ---- 3. the placement table on cuda, byte for byte against cpu ------------------------------
small=$WORK/small
rm -rf "$small"
"$SL" synth "$small" --size 256MiB --shards 2 >/dev/null || die "synth $small failed"
# the GPU must be usable by the cuda backend, else nothing below means anything
if ! probe=$("$SL" load "$small" --backend cuda 2>&1 >/dev/null); then
  check "cuda backend usable" FAIL "$probe"
  die "the cuda backend cannot run here: $probe"
fi
# What one load reports, in one cell: placements, pinned tensors, collective, seconds.
jsum() {
  "$PYTHON" - "$1" <<'PY'
import json, sys, collections
d = json.load(open(sys.argv[1]))
ranks = d.get("ranks", [d])  # --nproc: one document, every rank's report in "ranks"
c = collections.Counter((t["placement"], t["pinned"]) for r in ranks for t in r["tensors"])
where = ", ".join(f"{n} {p}{' pinned' if pin else ''}" for (p, pin), n in sorted(c.items()))
secs = d["wall_seconds"] if "ranks" in d else d["totals"]["seconds"]
print(f"{where}; {d['collective']['name']}; {secs:.3f} s")
PY
}
# same_load TAG ARGS...: the load on cpu and on cuda, dumps compared; prints the cuda summary.
# $cuda_args: extra arguments for the cuda load only (a collective the cpu backend cannot run).
cuda_args=()
same_load() {
  local tag=$1; shift
  local d=$WORK/$tag j=$OUT/loads/$tag b rc f n=0 bad=""
  rm -rf "$d"
  for b in cpu cuda; do
    local extra=()
    [ $b = cpu ] || extra=("${cuda_args[@]}")
    timeout 300 "$SL" load "$@" "${extra[@]}" --backend $b --dump "$d/$b" --json --timeout 120 >"$j.$b.json" 2>"$j.$b.err"
    rc=$?
    if [ $rc -ne 0 ]; then
      echo "$b exit $rc: $(head -c 400 "$j.$b.err")"
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
  jsum "$j.cuda.json"
}
{
  echo "## Placement table: --backend cuda, 256 MiB BF16 in 2 shards, dumps == --backend cpu"
  echo
  echo "| --cpu-offload | --offload-policy | --param-dtype | cuda placement (tensors); collective; seconds | == cpu |"
  echo "|---|---|---|---|---|"
} >"$OUT/placement.md"
for off in on off infer; do
  for pol in none cpu cpu-pinned; do
    for dt in file F32; do
      [ $dt = F32 ] && [ $pol = cpu ] && continue # casts: one row per placement is enough
      args=(--cpu-offload "$off" --offload-policy "$pol")
      [ $dt = F32 ] && args+=(--param-dtype F32)
      if res=$(same_load "place-$off-$pol-$dt" "$small" "${args[@]}"); then
        echo "| $off | $pol | $dt | $res | yes |" >>"$OUT/placement.md"
      else
        echo "| $off | $pol | $dt | $res | **NO** |" >>"$OUT/placement.md"
        failed_place="${failed_place:-} $off/$pol/$dt"
      fi
    done
  done
done
if [ -z "${failed_place:-}" ]; then check "placement table" OK "15 loads, every dump == cpu (placement.md)"; else
  check "placement table" FAIL "differs or fails:${failed_place} (placement.md)"; fi

# ---- 4. two ranks on the one GPU ------------------------------------------------------------
if res=$(same_load two-gloo "$small" --nproc 2 --collective gloo); then
  check "2 ranks, 1 GPU, gloo" OK "dumps == cpu; $res"
else check "2 ranks, 1 GPU, gloo" FAIL "$res"; fi
if res=$(same_load two-gloo-cast "$small" --nproc 2 --collective gloo --param-dtype F32 --cpu-offload off); then
  check "2 ranks, 1 GPU, gloo, F32 cast" OK "dumps == cpu; $res"
else check "2 ranks, 1 GPU, gloo, F32 cast" FAIL "$res"; fi
cuda_args=(--collective nccl)
if res=$(same_load one-nccl "$small"); then
  check "1 rank, nccl" OK "dumps == cpu; $res"
else check "1 rank, nccl" FAIL "$res"; fi
cuda_args=()
# NCCL refuses two ranks on one device: the load must fail on every rank, say why, and
# return well within its timeout (never a hang). With more GPUs the ranks get one each.
for coll in nccl auto; do
  s0=$(date +%s%N)
  timeout 180 "$SL" load "$small" --nproc 2 --backend cuda --collective $coll --timeout 60 -v \
    >"$OUT/two-$coll.out" 2>"$OUT/two-$coll.err"
  rc=$?
  secs=$(awk -v a="$s0" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b - a) / 1e9}')
  msg=$(grep -m1 'shardload:' "$OUT/two-$coll.err" | head -c 300)
  if [ "$ngpu" -gt 1 ]; then
    if [ $rc -eq 0 ]; then check "2 ranks, $ngpu GPUs, --collective $coll" OK "${secs} s"
    else check "2 ranks, $ngpu GPUs, --collective $coll" FAIL "exit $rc: $msg"; fi
  elif [ $coll = nccl ]; then
    # the refusal is the expected outcome; a success would be news, a timeout (124) a hang
    if [ $rc -eq 1 ] && echo "$msg" | grep -qi nccl; then check "2 ranks, 1 GPU, nccl (refusal)" OK "exit 1 in ${secs} s: $msg"
    else check "2 ranks, 1 GPU, nccl (refusal)" FAIL "exit $rc in ${secs} s: ${msg:-no message}"; fi
  else
    # auto: either it avoids nccl (gloo) and loads, or it fails saying why; never a hang
    if [ $rc -eq 0 ] || { [ $rc -eq 1 ] && [ -n "$msg" ]; }; then
      check "2 ranks, 1 GPU, auto" OK "exit $rc in ${secs} s: $(grep -m1 '^collective:' "$OUT/two-$coll.out")${msg}"
    else check "2 ranks, 1 GPU, auto" FAIL "exit $rc in ${secs} s: ${msg:-no message}"; fi
  fi
done

# ---- 5. ~4 GiB from the page cache to GPU memory --------------------------------------------
big=$WORK/big.safetensors
rm -f "$big"
"$SL" synth "$big" --size "$SIZE" >/dev/null 2>"$OUT/synth.err" || die "synth $SIZE failed: $(cat "$OUT/synth.err")"
bytes=$(stat -c %s "$big")
cat "$big" >/dev/null # warm the page cache
# background sampler of device memory (MiB), written while the tagged command runs
sample_mem() { # sample_mem FILE: until killed
  while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >>"$1" 2>/dev/null; sleep 0.05; done
}
peak_of() { sort -n "$1" | tail -n 1; }
base_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
read_gbs=$(dd if="$big" of=/dev/null bs=16M 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
: >"$OUT/mem-shardload.txt"
sample_mem "$OUT/mem-shardload.txt" & sampler=$!
for rep in 1 2 3; do
  timeout 300 "$SL" load "$big" --backend cuda --json --timeout 120 >"$OUT/big-shardload-$rep.json" 2>"$OUT/big-shardload-$rep.err" ||
    { check "$SIZE shardload" FAIL "rep $rep: $(head -c 300 "$OUT/big-shardload-$rep.err")"; break; }
done
kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
sl_peak=$(peak_of "$OUT/mem-shardload.txt")
: >"$OUT/mem-torch.txt"
sample_mem "$OUT/mem-torch.txt" & sampler=$!
timeout 300 "$PYTHON" - "$big" >"$OUT/big-torch.json" 2>"$OUT/big-torch.err" <<'PY'
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
th_peak=$(peak_of "$OUT/mem-torch.txt")
"$PYTHON" - "$OUT" "$bytes" "$base_mib" "$sl_peak" "$th_peak" "$read_gbs" "$trc" >"$OUT/big.md" <<'PY'
import glob, json, statistics, sys
out, nbytes, base, slp, thp, read, trc = sys.argv[1:8]
nbytes = int(nbytes); base = float(base or 0)
runs = []
for f in sorted(glob.glob(f"{out}/big-shardload-*.json")):
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
    t = json.load(open(f"{out}/big-torch.json"))
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
if [ -s "$OUT/big-shardload-3.json" ] && [ $trc -eq 0 ]; then
  check "$SIZE page cache -> GPU" OK "$(grep -E '^\| shardload|^shardload /' "$OUT/big.md" | tr '\n' ' ' | head -c 300)"
else
  check "$SIZE page cache -> GPU" FAIL "see big-shardload-*.err, big-torch.err"
fi
rm -f "$big"

# ---- 6. the Python drop-in on the GPU (issue 9), world 1 --------------------------------------
# The equivalence test of CI on a cuda mesh: Accelerate's own fsdp2_load_full_state_dict against
# shardload.accelerate's, policies none / CPUOffloadPolicy(pin_memory False and True) x
# cpu_offload True/False/None/legacy x dict/path: bit-identical shards, on cuda or (pinned) CPU
# as the placement table says, an SGD step after; then the cases where Accelerate fails.
if "$PYTHON" -c 'import accelerate, torch.distributed.fsdp' 2>/dev/null; then
  p0=$(date +%s)
  SHARDLOAD_LIBRARY=$BUILD/libshardload.so PYTHONPATH=$SRC/python timeout 420 \
    "$PYTHON" "$SRC/python/tests/test_accelerate_equiv.py" --world 1 --device cuda --tmp "$WORK/python" \
    >"$OUT/python-dropin.log" 2>&1
  prc=$?
  if [ $prc -eq 0 ] && grep -q 'checks on rank 0 passed' "$OUT/python-dropin.log"; then
    check "python drop-in (cuda mesh)" OK "$(( $(date +%s) - p0 )) s: $(grep -E '^backend|checks on rank 0' "$OUT/python-dropin.log" | tr '\n' ' ')"
  else
    check "python drop-in (cuda mesh)" FAIL "exit $prc; see python-dropin.log: $(grep -m1 -E 'Error|error' "$OUT/python-dropin.log" | head -c 200)"
  fi
  # the drop-in against Accelerate's function, world 1: device placement, then CPU offload (pinned)
  for off in none cpu+pin; do
    SHARDLOAD_LIBRARY=$BUILD/libshardload.so PYTHONPATH=$SRC/python timeout 240 \
      "$PYTHON" "$SRC/bench/bench_accelerate.py" --device cuda --worlds 1 --offload "$off" --repeat 2 \
      --dir "$WORK/bench-accel" --json "$OUT/bench-accelerate-$off.json" >"$OUT/bench-accelerate-$off.log" 2>&1
    brc=$?
    check "python bench (world 1, cuda, offload $off)" "$([ $brc -eq 0 ] && echo OK || echo FAIL)" \
      "exit $brc; $(grep -m1 -E '^\| 1 \| dict' "$OUT/bench-accelerate-$off.log" | head -c 200) (bench-accelerate-$off.log)"
  done
else
  check "python drop-in (cuda mesh)" FAIL "$PYTHON cannot import accelerate and torch.distributed.fsdp"
fi
rm -rf "$WORK/python" "$WORK/bench-accel"

# ---- summary --------------------------------------------------------------------------------
{
  echo "| check | result | detail |"
  echo "|---|---|---|"
  cat "$SUMMARY.rows"
  echo
  cat "$OUT/placement.md"
  echo
  cat "$OUT/big.md"
  echo
  echo "total: $(( $(date +%s) - t0 )) s"
} >>"$SUMMARY"
rm -f "$SUMMARY.rows"
say "done in $(( $(date +%s) - t0 )) s: $([ $failed = 0 ] && echo 'every check passed' || echo 'SOME CHECKS FAILED') (see $SUMMARY)"
exit $failed
