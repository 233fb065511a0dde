#!/usr/bin/env bash
# Installs what the build and tests need, only what is missing (idempotent, quiet).
#   scripts/deps.sh            Debian packages for the build
#   scripts/deps.sh --fuzz     ... plus clang and its sanitizer/libFuzzer runtimes
#   scripts/deps.sh --python   ... plus a Python venv with the reference implementations the
#                              cross-checks and torchrun tests run against (torch, safetensors,
#                              accelerate from PyPI; torch is a large download the first time).
#                              Prints the venv's python on stdout.
#   scripts/deps.sh --cuda     installs nothing more (the CUDA toolkit and NCCL are NVIDIA's
#                              multi-GB installs, made by the machine's image): prints the nvcc
#                              the CUDA modules build with when nvcc and nccl.h are both there,
#                              else nothing, and says on stderr what is missing. No GPU needed.
# The venv lives at $SHARDLOAD_VENV (default ~/.cache/shardload/venv) so it outlives clones.
set -euo pipefail
fuzz=0 python=0 cuda=0
for a in "$@"; do
  case "$a" in
    --fuzz) fuzz=1 ;;
    --python) python=1 ;;
    --cuda) cuda=1 ;;
    *) echo "deps: unknown option $a" >&2; exit 2 ;;
  esac
done
pkgs=(cmake make gcc g++ pkg-config libgloo-dev libcmocka-dev libjansson-dev libxxhash-dev libsodium-dev)
if [ "$fuzz" = 1 ]; then pkgs+=(clang libclang-rt-14-dev); fi
if [ "$python" = 1 ]; then pkgs+=(python3 python3-venv); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$python" = 1 ]; then
  venv="${SHARDLOAD_VENV:-$HOME/.cache/shardload/venv}"
  if ! "$venv/bin/python" -c 'import torch, safetensors, accelerate' 2>/dev/null; then
    echo "deps: creating $venv with torch, safetensors, accelerate (first time: several minutes)" >&2
    # the Debian python3 has venv; a pyenv or other python3 earlier on PATH works as well
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check 'torch>=2.15' safetensors accelerate numpy >&2
  fi
  echo "$venv/bin/python"
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
