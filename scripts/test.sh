#!/usr/bin/env bash
# The test command: install what the build and tests need (Debian packages, and a venv with
# torch, safetensors and accelerate for the cross-checks and the torchrun tests), configure,
# build and run every test (CPU preset: cpu + sim backends, Gloo over loopback). Nothing skips:
# SHARDLOAD_REQUIRE_TORCH=1 turns a missing reference implementation into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLOAD_PYTHON="$(bash scripts/deps.sh --python)"
export SHARDLOAD_PYTHON SHARDLOAD_REQUIRE_TORCH=1
cmake --workflow --preset cpu
