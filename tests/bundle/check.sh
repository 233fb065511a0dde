#!/usr/bin/env bash
# The GPU bundle (bench/gpu-bundle.sh) is self-contained: built here, moved away from where it
# was built, its command runs in a root that holds only the C runtime (libc, libm, libstdc++,
# libgcc_s, the dynamic loader: what the GPU machine's image surely has) and nothing else:
#   - `shardload load --nproc 2` on a synthetic checkpoint loads (two ranks over Gloo);
#   - `--backend cuda` fails with the no-driver reason, and the gpu test programs start and
#     skip (77) for that reason;
#   - each library the bundle carries is needed: without it a bundled program fails to start,
#     naming it (so none is found anywhere but in the bundle);
#   - outside that root, the bundle's own gpu test runner works from the moved folder (every
#     test skips: no GPU), and bench/gpu-check.sh --bundle stops at once at "no GPU".
# Usage: check.sh SRC_DIR [BUNDLE_DIR]   (BUNDLE_DIR: use that bundle instead of building one)
# The bundle is built in a scratch folder under $TMPDIR (not in the build tree, whose every ELF
# test_elf_paths reads), removed when the check passes. CI cost: one Release build of the
# library, the command, the CUDA/NCCL modules (sm_90) and the two gpu test programs.
set -uo pipefail
src=$1
given=${2:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/shardload-bundle-check.XXXXXX") || exit 1
fail() {
  echo "FAIL: $*"
  echo "(scratch kept in $work)"
  exit 1
}

# ---- the bundle, built here, then moved: nothing may need the path it was built at ------------
if [ -n "$given" ]; then
  cp -a "$given" "$work/built" || fail "cannot copy $given"
else
  echo "building the bundle (bench/gpu-bundle.sh, its own Release build, sm_90)"
  bash "$src/bench/gpu-bundle.sh" --build "$work/build" --jobs "${BUNDLE_JOBS:-2}" "$work/built" >"$work/bundle.log" 2>&1 ||
    { cat "$work/bundle.log"; fail "gpu-bundle.sh failed"; }
  tail -n 2 "$work/bundle.log"
  rm -rf "$work/build"
fi
[ -f "$work/built/BUNDLE" ] || fail "no BUNDLE manifest in the bundle"
mv "$work/built" "$work/moved" || fail "cannot move the bundle"
B=$work/moved
bytes=$(du -sb "$B" | cut -f1)
[ "$bytes" -lt $((16 * 1048576)) ] || fail "the bundle holds $bytes bytes, not under 16 MiB"
echo "bundle: $bytes bytes, $(find "$B" -type f | wc -l) files"
# every file of the bundle that gpu-check.sh runs ($B/...) is in it: a script left out is a check
# that fails only on the GPU machine
missing=""
for rel in $(grep -o '"\$B/[A-Za-z0-9_./-]*' "$B/bench/gpu-check.sh" | sed 's|^"\$B/||' | sort -u); do
  [ -e "$B/$rel" ] || missing="$missing $rel"
done
[ -z "$missing" ] || fail "gpu-check.sh runs files the bundle lacks:$missing"

# ---- a root with only the C runtime -------------------------------------------------------------
# What the bundle's programs take from outside it, as the loader resolves them here: each must
# be part of the C runtime, and only those files go into the root (at the same paths).
root=$work/root
mkdir -p "$root/b" "$root/data" "$root/tmp" && chmod 1777 "$root/tmp"
cp -a "$B/." "$root/b/" || fail "cannot copy the bundle into the root"
progs=("$root/b/bin/shardload")
for t in "$root"/b/tests/*; do [ -f "$t" ] && progs+=("$t"); done
runtime='^(libc\.so\.6|libm\.so\.6|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux[-.a-z0-9_]*\.so\.[0-9]+|linux-vdso\.so\.1)$'
declare -A put=()
for p in "${progs[@]}" "$root"/b/lib/libshardload*; do # (a copied library alone would not search lib/)
  interp=$(readelf -lW "$p" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
  [ -z "$interp" ] || put[$interp]=1
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in "$root"/b/*) continue ;; esac
    [[ $name =~ $runtime ]] || fail "$(basename "$p") takes $name from $path: not the C runtime and not in the bundle"
    put[$path]=1
  done < <(ldd "$p" 2>&1)
done
for path in "${!put[@]}"; do
  mkdir -p "$root$(dirname "$path")" && cp -L "$path" "$root$path" || fail "cannot copy $path into the root"
done
echo "root: $(cd "$root" && find . -type f -not -path './b/*' | sort | tr '\n' ' ')"
# chroot in a mount and pid namespace of its own with /proc mounted (the loader reads
# /proc/self/exe to expand $ORIGIN, as on any real machine); as root (CI), or elsewhere in a user
# namespace that maps us to root
mkdir -p "$root/proc"
userns=()
[ "$(id -u)" = 0 ] || userns=(-r)
if unshare "${userns[@]}" -m -p -f --mount-proc="$root/proc" true 2>/dev/null; then
  in_root() { unshare "${userns[@]}" -m -p -f --mount-proc="$root/proc" chroot "$root" "$@"; }
else
  echo "SKIPPED: cannot make a mount namespace here (not root, and no user namespaces; CI runs as root)"
  exit 77
fi
loaderr='error while loading shared libraries'

out=$(in_root /b/bin/shardload --version 2>&1) || fail "shardload --version in the root: $out"
echo "in the root: $out"
out=$(in_root /b/bin/shardload synth /data/ck --size 8MiB --shards 2 --seed 3 2>&1) || fail "synth in the root: $out"
# two ranks on one host (shm data plane, Gloo control plane on loopback), from the bundle alone
in_root /b/bin/shardload load /data/ck --nproc 2 --backend cpu --json --timeout 60 >"$work/load.json" 2>"$work/load.err" ||
  fail "load --nproc 2 in the root: exit $?: $(head -c 600 "$work/load.err")"
summary=$(python3 - "$work/load.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ranks = d["ranks"]
assert d["world_size"] == 2 and len(ranks) == 2, f"world {d['world_size']}, {len(ranks)} ranks"
assert d["collective"]["name"] == "shm", d["collective"]  # host staging on one host
n = [len(r["tensors"]) for r in ranks]
assert min(n) > 0, f"tensors per rank {n}"
print(f"{len(ranks)} ranks over {d['collective']['name']}, {n} tensors, {d['checkpoint_bytes']} checkpoint bytes")
PY
) || fail "load --nproc 2 in the root: unexpected report: $summary"
echo "in the root: load --nproc 2: $summary"
# no driver in the root: the cuda backend says so
out=$(in_root /b/bin/shardload load /data/ck --backend cuda --timeout 20 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "load --backend cuda in the root: exit $rc (want 1): $out"
echo "$out" | grep -q 'cuda: no CUDA driver (libcuda.so.1 not found' || fail "load --backend cuda: not the no-driver reason: $out"
echo "in the root: --backend cuda: $(echo "$out" | grep -m1 'no CUDA driver' | head -c 200)"
# the gpu test programs start and skip for the same reason
gpu_tests() {
  SHARDLOAD_CUDA_MODULES=/b/lib SHARDLOAD_MODULE_PATH=/b/lib SHARDLOAD_BIN=/b/bin/shardload SHARDLOAD_TEST_TMP=/tmp/t \
    in_root /b/tests/test_cuda_modules --gpu 2>&1
  echo "rc=$?"
  in_root /b/tests/test_cuda_gpu /b/lib/libshardload-cuda.so 2>&1
  echo "rc=$?"
}
out=$(gpu_tests)
[ "$(echo "$out" | grep -c '^rc=77$')" = 2 ] || fail "the gpu test programs in the root do not both skip: $out"
echo "in the root: the gpu test programs skip: $(echo "$out" | grep -m1 -i skip | head -c 160)"

# ---- every carried library is needed, and found nowhere else ---------------------------------------
n=0
for lib in "$root"/b/lib/*.so*; do
  name=$(basename "$lib")
  case "$name" in libshardload-*.so) continue ;; esac # modules: opened by name, checked above
  mv "$lib" "$work/away" || fail "cannot move $name"
  out=$(in_root /b/bin/shardload --version 2>&1; gpu_tests)
  mv "$work/away" "$lib"
  echo "$out" | grep -q "$loaderr: $name" || fail "without lib/$name every bundled program still starts: it is not needed, or found outside the bundle ($out)"
  n=$((n + 1))
done
[ $n -ge 5 ] || fail "only $n libraries in the bundle's lib/: where are Gloo, jansson, libsodium, xxhash, cmocka?"
echo "each of the $n carried libraries is needed: without it a program fails with '$loaderr'"
out=$(in_root /b/bin/shardload --version 2>&1) || fail "the root is broken after the removals: $out"

# ---- outside the root: the bundle's own runners, from the moved folder ----------------------------
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "a GPU is here: the bundle's gpu tests and gpu-check.sh run on GPU machines, not in this check"
else
  out=$(bash "$B/run-gpu-tests.sh" "$work/gpu-tests" 2>&1)
  rc=$?
  [ $rc -eq 77 ] || fail "run-gpu-tests.sh from the moved bundle: exit $rc (want 77, every test skipped): $out"
  skips=$(echo "$out" | grep -c '^SKIP ')
  [ "$skips" -ge 3 ] && ! echo "$out" | grep -q '^FAIL' || fail "run-gpu-tests.sh: not every test skipped: $out"
  echo "run-gpu-tests.sh from the moved bundle: $skips tests, each skipped (no GPU)"
  s0=$SECONDS
  timeout 120 bash "$B/bench/gpu-check.sh" --bundle "$B" --smoke --out "$work/gpu-check" >"$work/gpu-check.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] || fail "gpu-check.sh --smoke passed on a machine without a GPU"
  [ $rc -ne 124 ] || fail "gpu-check.sh --smoke ran past 120 s without a GPU"
  grep -q 'no GPU' "$work/gpu-check/summary.md" ||
    fail "gpu-check.sh without a GPU: summary.md does not say 'no GPU': $(cat "$work/gpu-check.log")"
  echo "gpu-check.sh --smoke without a GPU: exit $rc in $((SECONDS - s0)) s: $(grep -m1 'no GPU' "$work/gpu-check/summary.md" | head -c 200)"
fi
rm -rf "$work"
echo "gpu bundle: self-contained"
