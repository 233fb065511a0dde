#!/usr/bin/env bash
# The nccl module on real GPUs, through the whole library and the command (label gpu):
#  - on any machine with a GPU: two ranks on one GPU (--device 0) are refused on every rank, at
#    once, by the core's data-plane agreement before NCCL starts (they share a PCI bus id on one
#    machine: NCCL cannot run them), with what to do; under auto they load over Gloo staging and
#    the reason says why;
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

# Two ranks on GPU 0, forced: refused by the ranks' agreement on every rank (not a hang, not an
# NCCL error), in far less than the timeout.
start=$SECONDS
out=$(timeout 300 "$BIN" load "$TMP/ck" --nproc 2 --backend cuda --collective nccl --device 0 --timeout 60 2>&1)
rc=$?
took=$((SECONDS - start))
echo "$out" | tail -5
[ $rc -ne 0 ] || fail "two ranks on one GPU loaded over NCCL (rc 0)"
[ $rc -ne 124 ] || fail "two ranks on one GPU hung"
echo "$out" | grep -q "SL_ERR_UNSUPPORTED" || fail "the refusal is not SL_ERR_UNSUPPORTED"
echo "$out" | grep -q "the collective nccl was asked for, but ranks 0 and 1 share device " ||
  fail "no 'ranks 0 and 1 share device' in the refusal"
echo "$out" | grep -q "nccl needs one device per rank; use --collective gloo (host staging), or give each rank its own device" ||
  fail "the refusal does not say what to do"
[ $took -lt 40 ] || fail "the refusal took $took s (the timeout is 60 s): it waited instead of agreeing"
echo "refusal took $took s"

# The same ranks under auto: Gloo staging, and the reason names the shared GPU.
out=$(timeout 300 "$BIN" load "$TMP/ck" --nproc 2 --backend cuda --device 0 --timeout 60 2>&1)
rc=$?
[ $rc -eq 0 ] || { echo "$out" | tail -5; fail "two ranks on one GPU under auto: exit $rc"; }
echo "$out" | grep -q "^collective: gloo: ranks 0 and 1 share device .* (cuda) on .*; nccl needs one device per rank" ||
  { echo "$out" | grep "collective"; fail "auto on one GPU: not gloo with the shared device as the reason"; }
echo "auto on one GPU: $(echo "$out" | grep -m1 '^collective:')"

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
