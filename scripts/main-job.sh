#!/usr/bin/env bash
# The main job on the embedded default: build, write a 1 GiB synthetic checkpoint, and load it
# on 4 local ranks (CPU backend, Gloo over loopback), printing the per-rank report.
# Usage: scripts/main-job.sh [CHECKPOINT_DIR] [extra `shardload load` flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)" --target shardload_cli >/dev/null
ckpt="${1:-/tmp/shardload-demo}"
shift || true
bin=build/cpu/shardload
if [ ! -e "$ckpt/model.safetensors.index.json" ]; then
  "$bin" synth "$ckpt" --size 1GiB --dtype BF16 --shards 4
fi
"$bin" load "$ckpt" --nproc 4 --backend cpu "$@"
