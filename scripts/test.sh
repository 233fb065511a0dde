#!/usr/bin/env bash
# The test command: install what the build needs, configure, build and run every test
# (CPU preset: cpu + sim backends, Gloo over loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --workflow --preset cpu
