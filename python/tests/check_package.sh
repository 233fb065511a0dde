#!/usr/bin/env bash
# `pip install ./python` works and the installed package (not the source tree) loads the built
# libshardload and loads a checkpoint. Usage: check_package.sh PYTHON PYTHON_SRC LIBSHARDLOAD TMP
set -euo pipefail
py="$1" src="$2" lib="$3" tmp="$4"
rm -rf "$tmp" && mkdir -p "$tmp"
cp -r "$src" "$tmp/src" # setuptools writes build/ and *.egg-info beside the sources
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info
# no build isolation: the venv's setuptools builds it, no download
"$py" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --target "$tmp/site" "$tmp/src"
test -f "$tmp/site/shardload/__init__.py" || { echo "check_package: shardload not installed under $tmp/site" >&2; exit 1; }
cd "$tmp"
PYTHONPATH="$tmp/site" SHARDLOAD_LIBRARY="$lib" "$py" - "$tmp" <<'PY'
import os, sys
tmp = sys.argv[1]
import shardload
assert shardload.__file__.startswith(os.path.join(tmp, "site")), shardload.__file__
from safetensors.torch import save_file
import torch
save_file({"w": torch.arange(12, dtype=torch.float32).reshape(4, 3)}, os.path.join(tmp, "m.safetensors"))
with shardload.Context() as ctx:
    st = ctx.load(ctx.plan(), ctx.open(os.path.join(tmp, "m.safetensors")))
    assert torch.equal(st["w"].to_torch(), torch.arange(12, dtype=torch.float32).reshape(4, 3))
print(f"check_package: installed {shardload.__file__}, libshardload {shardload.version()} from {shardload.library_path()}: ok")
PY
# without SHARDLOAD_LIBRARY and outside the source tree: the installed library, or one clear error
if out="$(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c 'import shardload; print(shardload.library_path())' 2>&1)"; then
  echo "check_package: without SHARDLOAD_LIBRARY it found an installed $out"
elif grep -q "libshardload not found" <<<"$out" && grep -q "SHARDLOAD_LIBRARY" <<<"$out"; then
  echo "check_package: without SHARDLOAD_LIBRARY: $(tail -n1 <<<"$out" | cut -c1-160)..."
else
  echo "check_package: unexpected failure without a library: $out" >&2; exit 1
fi
# python -m shardload: this package carries no command; it says so and how to get one (exit 2)
set +e
out="$(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -m shardload backends 2>&1)"; rc=$?
set -e
[ "$rc" = 2 ] && grep -q "carries no command" <<<"$out" && grep -q "pip install \." <<<"$out" ||
  { echo "check_package: python -m shardload without a command: rc $rc: $out" >&2; exit 1; }
echo "check_package: python -m shardload: $(cut -c1-100 <<<"$out")..."
echo "check_package: ok"
