#!/usr/bin/env bash
# The wheel runs where nothing was built: scripts/wheel.sh makes it, and inside a
# root holding only the C runtime and Python (Debian 12 minbase + python3, python3-venv:
# tests/wheel/rootfs.sh, built once and cached) a fresh venv installs it (no index, no deps):
#   - import; the library is the wheel's own (shardload/_lib), and the root has no compiler,
#     no -dev header, no Gloo/jansson/sodium/xxhash of its own (ldconfig knows none);
#   - python -m shardload inspect / plan / backends / load --nproc 2 (two ranks over Gloo), and
#     the exit status of a failing command passed through;
#   - where the wheel has the CUDA/NCCL modules: they load and say "no CUDA driver"; the command
#     alone says NCCL is not found (and names a $SHARDLOAD_NCCL_LIBRARY that does not load),
#     `python -m shardload` finds the nvidia-nccl wheel's (when the torch there has one);
#   - torchrun at world 2 (tests/wheel/ranks.py): a Context load and the Accelerate drop-in into
#     an FSDP2 ToyLlama, every rank's shards compared here, outside the root, bit for bit with
#     torch.chunk of the checkpoint's tensors.
# torch, safetensors and accelerate are not installed into the root (gigabytes): the host venv's
# site-packages is bind-mounted read-only at /opt/hostsite and named by a .pth file in the
# root's venv (after the venv's own site-packages, where the wheel is). Needs root (chroot,
# mount namespaces: unshare -m), debootstrap and the wheel tools (scripts/deps.sh --package).
# Usage: check.sh SRC_DIR TMP_DIR HOST_PYTHON
set -uo pipefail
src=$1 tmp=$2 hostpy=$3
cache=${SHARDLOAD_CACHE:-$HOME/.cache/shardload}
t0=$(date +%s)
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "[$(($(date +%s) - t0)) s] $*"; }
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root (chroot, unshare -m)"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp" || fail "cannot make $tmp"

# SHARDLOAD_ROOTFS=host: the fallback root assembled from this machine's python (rootfs.sh)
rootdir=$cache/rootfs-bookworm
[ "${SHARDLOAD_ROOTFS:-}" != host ] || rootdir=$cache/rootfs-host
step "the root: tests/wheel/rootfs.sh $rootdir"
root=$(bash "$src/tests/wheel/rootfs.sh" "$rootdir") || fail "no minimal root (rootfs.sh failed)"
step "the wheel: scripts/wheel.sh"
bash "$src/scripts/wheel.sh" "$tmp/dist" >"$tmp/wheel.log" 2>&1 || { cat "$tmp/wheel.log"; fail "scripts/wheel.sh failed"; }
grep '^wheel: ' "$tmp/wheel.log" | tail -n 3
whl=$(ls "$tmp"/dist/*.whl) && [ "$(echo "$whl" | wc -l)" = 1 ] || fail "scripts/wheel.sh left not exactly one wheel: $whl"
case "$(basename "$whl")" in shardload-*-py3-none-manylinux_2_*_x86_64.whl) ;; *) fail "wheel tag: $(basename "$whl")" ;; esac
cuda=0
"$hostpy" -c 'import sys, zipfile; sys.exit("shardload/_lib/libshardload-nccl.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$whl" && cuda=1

step "the checkpoint and the reference, outside the root"
job=/tmp/shardload-wheel-check.$$
J=$root$job
rm -rf "$J" && mkdir -p "$J/dist" "$J/out" "$J/model" || fail "cannot make $J"
trap 'rm -rf "$J"' EXIT
cp "$whl" "$J/dist/" && cp "$src/tests/wheel/ranks.py" "$J/" && cp "$src/python/tests/_model.py" "$J/model/" || fail "copy"
PYTHONPATH=$src/python/tests "$hostpy" -c '
import sys; from _model import reference_state_dict, save_sharded
save_sharded(reference_state_dict(), sys.argv[1], shards=2)' "$J/ckpt" || fail "cannot write the checkpoint"
hostsite=$("$hostpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

cat >"$J/inner.sh" <<'INNER'
set -euo pipefail
job=$1 cuda=$2
fail() { echo "FAIL (in the root): $*"; exit 1; }
cd "$job"
for f in /usr/bin/gcc /usr/bin/cc /usr/bin/c++ /usr/bin/cmake /usr/include/jansson.h /usr/include/sodium.h \
         /usr/include/xxhash.h /usr/include/gloo; do [ ! -e "$f" ] || fail "the root has $f"; done
# (libxxhash0 is apt's own in minbase; the wheel's DT_NEEDED names its own hashed copy)
if /sbin/ldconfig -p | grep -E 'lib(gloo|jansson|sodium)'; then fail "the root's loader knows these libraries"; fi
[ -z "${SHARDLOAD_LIBRARY:-}${SHARDLOAD_MODULE_PATH:-}${LD_LIBRARY_PATH:-}" ] || fail "a library path is set"
python3 -m venv venv
venv/bin/pip install -q --no-index --no-deps --disable-pip-version-check dist/*.whl
py=$job/venv/bin/python
site=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /opt/hostsite >"$site/zz-host-torch.pth" # torch & co., after the venv's own packages
lib=$($py -c 'import shardload; print(shardload.library_path())')
[ "$lib" = "$site/shardload/_lib/libshardload.so.0" ] || fail "shardload loaded $lib, not the wheel's"
$py -c 'import torch, shardload; print(f"import: shardload {shardload.version()} from {shardload.library_path()}, torch {torch.__version__}")'
$py -m shardload inspect ckpt >inspect.txt || fail "python -m shardload inspect: $(cat inspect.txt)"
grep -q 'model.layers.1.mlp.down_proj.weight' inspect.txt || fail "inspect lists no tensors: $(head -5 inspect.txt)"
$py -m shardload plan ckpt --world 2 >plan.txt || fail "python -m shardload plan: $(cat plan.txt)"
grep -q 'lm_head.weight' plan.txt || fail "plan names no tensors: $(head -5 plan.txt)"
$py -m shardload backends >backends.txt || fail "python -m shardload backends"
grep -E '^(gloo) +yes' backends.txt >/dev/null || fail "gloo does not run: $(cat backends.txt)"
grep -q "module files are looked for in: $site/shardload/_lib" backends.txt || fail "modules not looked for in the package"
# the packaged command itself, not through python: it finds the modules beside its library too
"$site/shardload/_lib/shardload" backends >direct.txt || fail "the packaged shardload backends"
grep -q "module files are looked for in: $site/shardload/_lib" direct.txt || fail "the command looks elsewhere: $(tail -1 direct.txt)"
$py -m shardload load ckpt --nproc 2 >load.txt 2>&1 || fail "python -m shardload load --nproc 2: $(tail -5 load.txt)"
grep -Eq 'rank 1' load.txt || fail "load --nproc 2 printed no rank 1: $(tail -5 load.txt)"
# the exit status passes through: the command's own, for a missing checkpoint
set +e; "$site/shardload/_lib/shardload" inspect "$job/nothing" >/dev/null 2>&1; want=$?
$py -m shardload inspect "$job/nothing" >missing.txt 2>&1; got=$?; set -e
[ "$want" != 0 ] && [ "$got" = "$want" ] || fail "python -m shardload inspect MISSING exited $got, the command $want"
grep -q nothing missing.txt || fail "the command's error did not name the file: $(cat missing.txt)"
if [ "$cuda" = 1 ]; then
  grep -Eq '^cuda +no +2 .*cuda: no CUDA driver \(libcuda\.so\.1 not found' backends.txt ||
    fail "the wheel's cuda module did not load, or gave another reason: $(grep ^cuda backends.txt)"
  grep -E '^cuda ' backends.txt
  # a $SHARDLOAD_NCCL_LIBRARY that does not load is named in the reason
  SHARDLOAD_NCCL_LIBRARY=$job/no-libnccl.so.2 "$site/shardload/_lib/shardload" backends >bad.txt
  grep -E "^nccl .*not found .*SHARDLOAD_NCCL_LIBRARY=$job/no-libnccl.so.2 does not load" bad.txt >/dev/null ||
    fail "a bad SHARDLOAD_NCCL_LIBRARY is not named: $(grep ^nccl bad.txt)"
  grep -E '^nccl .*libnccl\.so\.2 not found' direct.txt >/dev/null ||
    fail "the command alone should find no NCCL here: $(grep ^nccl direct.txt)"
  if [ -f /opt/hostsite/nvidia/nccl/lib/libnccl.so.2 ]; then
    # python -m shardload names the nvidia-nccl wheel's copy (SHARDLOAD_NCCL_LIBRARY)
    grep -E '^nccl +no +2 .*nccl: no CUDA driver/device \(' backends.txt >/dev/null ||
      fail "python -m shardload did not find the wheel's NCCL: $(grep ^nccl backends.txt)"
    grep -E '^nccl ' backends.txt
  fi
fi
timeout 300 $py -m torch.distributed.run --standalone --nproc-per-node 2 ranks.py "$job/ckpt" "$job/out" "$job/model" >ranks.txt 2>&1 ||
  fail "torchrun world 2: $(tail -20 ranks.txt)"
grep 'rank [01]/2' ranks.txt
INNER

step "inside the root: venv, install, the commands, torchrun world 2"
unshare -m --propagation private bash -c '
  set -e
  root=$1 hostsite=$2 job=$3 cuda=$4
  mkdir -p "$root/opt/hostsite"
  mount --bind "$hostsite" "$root/opt/hostsite" && mount -o remount,bind,ro "$root/opt/hostsite"
  mount --rbind /proc "$root/proc" && mount --rbind /dev "$root/dev"
  exec chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$job" LANG=C.UTF-8 \
       /bin/bash "$job/inner.sh" "$job" "$cuda"' _ "$root" "$hostsite" "$job" "$cuda" || fail "inside the root"

step "the shards against the checkpoint, outside the root"
"$hostpy" - "$J/ckpt" "$J/out" <<'PY' || fail "shards differ"
import glob, os, sys, torch
from safetensors.torch import load_file
ckpt, out = sys.argv[1:]
full = {}
for f in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
    full.update(load_file(f))
n = 0
for kind in ("plain", "dropin"):
    for r in range(2):
        got = load_file(os.path.join(out, f"{kind}-{r}.safetensors"))
        assert set(got) == set(full), (kind, r, set(got) ^ set(full))
        for k, v in full.items():
            want = torch.chunk(v, 2, dim=0)[r] if v.dim() else v  # FSDP2's Shard(0)
            g = got[k]
            assert g.dtype == want.dtype and g.shape == want.shape and torch.equal(g, want), (kind, r, k, g.shape, want.shape)
            n += 1
print(f"{n} shards bit-identical to torch.chunk of the checkpoint (plain load and drop-in, ranks 0 and 1)")
PY
step "ok"
