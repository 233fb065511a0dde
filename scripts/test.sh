#!/usr/bin/env bash
# The test command: install what the build and tests need (Debian packages, and a venv with
# torch, safetensors and accelerate for the cross-checks and the torchrun tests), configure,
# build and run every test. SHARDLOAD_REQUIRE_TORCH=1 turns a missing reference implementation
# into a failure.
#
# The GPU vendors' modules are built where their toolchains are installed (no GPU needed):
#   CUDA  nvcc and NCCL's header (scripts/deps.sh --cuda finds them): libshardload-cuda.so and
#         libshardload-nccl.so and their tests;
#   HIP   hipcc and the HIP headers (scripts/deps.sh --hip installs Debian's ROCm; this script
#         only looks, unless SHARDLOAD_WITH_HIP=ON): libshardload-hip.so, libshardload-rccl.so
#         and their tests.
#   Level Zero  the loader's headers and the SPIR-V toolchain (scripts/deps.sh --level-zero;
#         likewise only looked for unless SHARDLOAD_WITH_LEVEL_ZERO=ON): libshardload-level_zero.so,
#         its kernels and their tests, over the test driver through the real loader. It goes
#         into whichever preset is chosen (the presets read SHARDLOAD_WITH_LEVEL_ZERO).
# Preset cuda-hip, cuda, hip or cpu, whichever the machine has; it says which. Then the only
# tests that may report SKIPPED are those labelled gpu (NVIDIA), amdgpu (AMD) or intelgpu (Intel), and only where
# no such GPU is usable; under the cpu preset nothing skips. SHARDLOAD_WITH_CUDA=OFF and
# SHARDLOAD_WITH_HIP=OFF leave a vendor out; SHARDLOAD_WITH_HIP=ON installs ROCm (Debian) and
# fails where hipcc cannot be had.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARDLOAD_PYTHON="$(bash scripts/deps.sh --python)"
export SHARDLOAD_PYTHON SHARDLOAD_REQUIRE_TORCH=1
# the wheel's test (label package): debootstrap and the wheel tools (scikit-build-core, auditwheel)
bash scripts/deps.sh --package >/dev/null
cuda="" hip="" why_cuda="SHARDLOAD_WITH_CUDA=OFF" why_hip="SHARDLOAD_WITH_HIP=OFF"
if [ "${SHARDLOAD_WITH_CUDA:-}" != OFF ]; then
  why_cuda="no nvcc with nccl.h here"
  cuda="$(bash scripts/deps.sh --cuda)"
  [ -z "$cuda" ] || export CUDACXX="${CUDACXX:-$cuda}" # CMake's CUDA detection, where nvcc is not on PATH
fi
case "${SHARDLOAD_WITH_HIP:-}" in
  OFF) ;;
  ON)
    hip="$(bash scripts/deps.sh --hip)"
    if [ -z "$hip" ]; then echo "test.sh: SHARDLOAD_WITH_HIP=ON but no usable hipcc (see above)" >&2; exit 1; fi ;;
  *)
    why_hip="no hipcc here (scripts/deps.sh --hip installs Debian's)"
    hip="$(bash scripts/deps.sh --hip --check 2>/dev/null)" ;;
esac
ze="" why_ze="SHARDLOAD_WITH_LEVEL_ZERO=OFF"
case "${SHARDLOAD_WITH_LEVEL_ZERO:-}" in
  OFF) ;;
  ON)
    ze="$(bash scripts/deps.sh --level-zero)"
    if [ -z "$ze" ]; then echo "test.sh: SHARDLOAD_WITH_LEVEL_ZERO=ON but its toolchain cannot be had (see above)" >&2; exit 1; fi ;;
  *)
    why_ze="no libze-dev or SPIR-V toolchain here (scripts/deps.sh --level-zero installs Debian's)"
    ze="$(bash scripts/deps.sh --level-zero --check 2>/dev/null)" ;;
esac
if [ -n "$ze" ]; then export SHARDLOAD_WITH_LEVEL_ZERO=ON; else export SHARDLOAD_WITH_LEVEL_ZERO=OFF; fi
if [ -n "$cuda" ] && [ -n "$hip" ]; then preset=cuda-hip
elif [ -n "$cuda" ]; then preset=cuda
elif [ -n "$hip" ]; then preset=hip
else preset=cpu
fi
if [ -n "$cuda" ]; then
  echo "test.sh: $cuda found: the CUDA/NCCL modules are built (gpu tests skip without an NVIDIA GPU)"
else
  echo "test.sh: the CUDA/NCCL modules are not built ($why_cuda)"
fi
if [ -n "$hip" ]; then
  echo "test.sh: $hip found: the HIP/RCCL modules are built (amdgpu tests skip without an AMD GPU)"
else
  echo "test.sh: the HIP/RCCL modules are not built ($why_hip)"
fi
if [ -n "$ze" ]; then
  echo "test.sh: the Level Zero module is built (over the test driver; no Intel GPU needed)"
else
  echo "test.sh: the Level Zero module is not built ($why_ze)"
fi
echo "test.sh: preset $preset"
# the workflow's steps (cmake --workflow --preset "$preset"), with ctest's JUnit report, so that
# the skip rule above is enforced: scripts/check_skips.py fails on any skipped test not labelled
# gpu, amdgpu or intelgpu (even when every test passed)
junit="$PWD/build/$preset/ctest-junit.xml"
rm -f "$junit"
cmake --preset "$preset"
cmake --build --preset "$preset"
rc=0
ctest --preset "$preset" --output-junit "$junit" || rc=$?
"$SHARDLOAD_PYTHON" scripts/check_skips.py "build/$preset" "$junit" || rc=1
# The tests' scratch (checkpoints, dumps, a debootstrapped root: gigabytes) goes when every test
# passed; after a failure it stays for a look, as it does with SHARDLOAD_KEEP_TEST_TMP=1.
if [ "$rc" = 0 ] && [ "${SHARDLOAD_KEEP_TEST_TMP:-}" != 1 ]; then rm -rf "build/$preset/test-tmp"; fi
exit "$rc"
