#!/usr/bin/env bash
# The nccl module on real GPUs, through the whole library and the command (label gpu):
#  - on any machine with a GPU: two ranks on one GPU are refused on every rank, at once, with
#    the one-GPU-per-rank message (NCCL cannot run them);
#  - with two or more GPUs: a 2-rank load over NCCL (scatter and broadcast strategies) gives
#    every rank bytes identical to the CPU + Gloo load of the same checkpoint.
# Exit 77 (skipped) without a GPU. Usage: test_nccl_gpu.sh SHARDLOAD_BIN SCRATCH_DIR
set -u
BIN=$1
TMP=$2
rm -rf "$TMP" && mkdir -p "$TMP" || exit 1

n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${n:-0}" -lt 1 ]; then
  echo "SKIPPED: no NVIDIA GPU here (nvidia-smi lists none)"
  exit 77
fi
echo "GPUs: $n"
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" synth "$TMP/ck" --size 64MiB --shards 2 --seed 7 >/dev/null || fail "synth"

# Two ranks on GPU 0: refused by nccl's init on every rank (not a hang, not an NCCL error).
start=$SECONDS
out=$(timeout 300 "$BIN" load "$TMP/ck" --nproc 2 --backend cuda --collective nccl --device 0 --timeout 60 2>&1)
rc=$?
echo "$out" | tail -5
[ $rc -ne 0 ] || fail "two ranks on one GPU loaded over NCCL (rc 0)"
[ $rc -ne 124 ] || fail "two ranks on one GPU hung"
echo "$out" | grep -q "share GPU" || fail "no 'share GPU' in the refusal"
echo "$out" | grep -q "NCCL needs one GPU per rank (use --collective gloo" || fail "the refusal does not say what to do"
echo "refusal took $((SECONDS - start)) s"

if [ "$n" -lt 2 ]; then
  echo "one GPU: the 2-rank NCCL load needs two; refusal checked, done"
  exit 0
fi

"$BIN" load "$TMP/ck" --nproc 2 --backend cpu --collective gloo --dump "$TMP/ref" --timeout 120 >/dev/null ||
  fail "reference CPU load"
for strategy in scatter broadcast; do
  "$BIN" load "$TMP/ck" --nproc 2 --backend cuda --collective nccl --cpu-offload off --strategy "$strategy" \
    --timeout 120 --dump "$TMP/$strategy" --json >"$TMP/$strategy.json" 2>"$TMP/$strategy.err" ||
    { cat "$TMP/$strategy.err"; fail "2-rank NCCL load ($strategy)"; }
  grep -q '"nccl"' "$TMP/$strategy.json" || fail "$strategy: the data collective was not nccl"
  for r in 0 1; do
    cmp "$TMP/ref/rank-$r.safetensors" "$TMP/$strategy/rank-$r.safetensors" ||
      fail "$strategy: rank $r's shards differ from the CPU + Gloo load"
  done
  echo "$strategy: 2 ranks over NCCL, bytes identical to CPU + Gloo"
done
exit 0
