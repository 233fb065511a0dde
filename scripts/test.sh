#!/usr/bin/env bash
# The test command: install what the build and tests need (Debian packages, and a venv with
# torch, safetensors and accelerate for the cross-checks and the torchrun tests), configure,
# build and run every test. SHARDLOAD_REQUIRE_TORCH=1 turns a missing reference implementation
# into a failure.
#
# Where the CUDA toolkit and NCCL's header are installed (nvcc; a GPU is not needed) it runs the
# "cuda" preset: the cpu preset plus libshardload-cuda.so and libshardload-nccl.so, and their
# tests. Then the only tests that may report SKIPPED are those labelled "gpu", and only where
# no GPU is usable. Elsewhere it runs the "cpu" preset, where nothing skips. It says which.
# SHARDLOAD_WITH_CUDA=OFF forces the cpu preset.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLOAD_PYTHON="$(bash scripts/deps.sh --python)"
export SHARDLOAD_PYTHON SHARDLOAD_REQUIRE_TORCH=1
preset=cpu why="SHARDLOAD_WITH_CUDA=OFF"
if [ "${SHARDLOAD_WITH_CUDA:-}" != OFF ]; then
  why="no nvcc with nccl.h here"
  nvcc="$(bash scripts/deps.sh --cuda)"
  if [ -n "$nvcc" ]; then
    preset=cuda
    export CUDACXX="${CUDACXX:-$nvcc}" # CMake's CUDA detection, where nvcc is not on PATH
  fi
fi
if [ "$preset" = cuda ]; then
  echo "test.sh: $nvcc found: preset cuda (cpu + the CUDA/NCCL modules, -DSHARDLOAD_WITH_CUDA=ON; gpu tests skip without a GPU)"
else
  echo "test.sh: preset cpu ($why: the CUDA/NCCL modules are not built)"
fi
cmake --workflow --preset "$preset"
