#!/usr/bin/env bash
# README.md's "PyTorch users" ```sh blocks, run as a user runs them: each block in a
# fresh venv made here, from a clean copy of the source tree (`git archive HEAD`, or a copy
# without build/ where there is no git), line by line, in order. torch, safetensors and
# accelerate are made visible without a download: a .pth file in the venv names the host
# venv's site-packages (after the venv's own, where `pip install` puts shardload), as
# tests/wheel/check.sh does for its root. Then, for each block's venv:
#   - `python -m shardload backends` works and lists gloo;
#   - `import shardload; shardload.library_path()` is the packaged library (block 1:
#     site-packages/shardload/_lib) or the copy's build tree (block 2: `pip install ./python`);
#   - python/tests/test_readme_torch.py, run by the venv's python with no PYTHONPATH or
#     SHARDLOAD_LIBRARY, loads the section's model at world 2 bit-exact from the installed package.
# A line that is not run as written is printed with the reason (never silently): only the
# workflow's test step (`cmake --workflow --preset cpu` runs the whole suite; here its configure
# and build steps, tests off). ccache is used where it is installed (CMAKE_*_COMPILER_LAUNCHER).
# Usage: sh_blocks.sh SRC_DIR TMP_DIR HOST_PYTHON
set -uo pipefail
src=$1 tmp=$2 hostpy=$3
t0=$(date +%s)
fail() { echo "FAIL: $*"; exit 1; }
step() { echo "[$(($(date +%s) - t0)) s] $*"; }
unset SHARDLOAD_LIBRARY SHARDLOAD_MODULE_PATH PYTHONPATH LD_LIBRARY_PATH VIRTUAL_ENV
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$tmp
fi
rm -rf "$tmp" && mkdir -p "$tmp" || fail "cannot make $tmp"
hostsite=$("$hostpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || fail "host python"
"$hostpy" -c 'import torch, safetensors, accelerate' || fail "the host python ($hostpy) lacks torch/safetensors/accelerate"

# the blocks: every ```sh fence between "## PyTorch users" and the next "## " heading
"$hostpy" - "$src/README.md" "$tmp" <<'PY' || fail "cannot read the README's sh blocks"
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
start = text.index("\n## PyTorch users\n")
end = text.find("\n## ", start + 1)
section = text[start:end if end > 0 else len(text)]
blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.S | re.M)
assert blocks, "no ```sh block in the section"
for i, b in enumerate(blocks, 1):
    open(f"{sys.argv[2]}/block{i}.sh", "w").write(b)
print(f"{len(blocks)} sh blocks")
PY
nblocks=$(ls "$tmp"/block*.sh | wc -l)
[ "$nblocks" = 2 ] || fail "the section has $nblocks sh blocks; this test knows the 2 it checks (update it)"

# the block as one shell script (a line's exports hold for the next ones), traced, with the
# substitutions said
run_block() {  # BLOCK_FILE WORKDIR VENV
  local script=$1.run
  { echo "set -euxo pipefail"; echo "source '$3/bin/activate'"; echo "cd '$2'"; } >"$script"
  local line cmd
  while IFS= read -r line; do
    cmd=$line
    case "$line" in
      "cmake --workflow --preset cpu"*)
        cmd="cmake --preset cpu -DSHARDLOAD_BUILD_TESTS=OFF >/dev/null && cmake --build --preset cpu -j${SHARDLOAD_JOBS:-2}"
        echo "  not as written: '${line%%#*}' (its test step is the whole suite, which CI runs anyway);" \
             "instead its configure and build steps, tests off: $cmd" ;;
    esac
    echo "$cmd" >>"$script"
  done <"$1"
  (bash "$script") >"$1.log" 2>&1 || { tail -n 40 "$1.log"; fail "README block $(basename "$1") failed"; }
  grep '^+ ' "$1.log" | grep -v "^+ source\|^+ cd '\|^+ set " | sed 's/^/    ran: /' | head -20
}

fresh() {  # N: a clean copy of the tree and a venv seeing the host's torch
  local w=$tmp/b$1
  mkdir -p "$w/src"
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    # the working tree as committed plus uncommitted edits: a stash commit of it, archived
    local rev; rev=$(git -C "$src" stash create 2>/dev/null); rev=${rev:-HEAD}
    git -C "$src" archive "$rev" | tar -x -C "$w/src" || fail "git archive"
  else
    (cd "$src" && tar -c --exclude=./build --exclude='./build-*' .) | tar -x -C "$w/src" || fail "copy"
  fi
  [ ! -e "$w/src/build" ] || fail "the copy has build/"
  "$hostpy" -m venv "$w/venv" || fail "venv"
  local site; site=$("$w/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$hostsite" >"$site/zz-host-torch.pth"
}

check_venv() {  # N WANT_LIBRARY
  local w=$tmp/b$1 py=$tmp/b$1/venv/bin/python
  [ "$1" = 2 ] || check_backends "$py" "$w"
  local lib; lib=$(cd "$tmp" && "$py" -c 'import shardload; print(shardload.library_path())') || fail "import shardload"
  # (library_path() is the file the loader opened: the soname link resolved)
  [ "$(realpath "$lib")" = "$(realpath "$2")" ] || fail "block $1: shardload loaded $lib, not $2"
  echo "  library: $lib"
  local pkg; pkg=$(cd "$tmp" && "$py" -c 'import shardload, os; print(os.path.dirname(shardload.__file__))')
  case "$pkg" in "$w/venv/"*) ;; *) fail "block $1: shardload imported from $pkg, not the venv" ;; esac
  step "  world-2 load_model (test_readme_torch.py) by the venv's python"
  (cd "$tmp" && SHARDLOAD_REQUIRE_TORCH=1 "$py" "$src/python/tests/test_readme_torch.py" --readme "$src/README.md" \
     --tmp "$w/readme") >"$w/readme.log" 2>&1 || { tail -n 30 "$w/readme.log"; fail "block $1: the README program"; }
}

check_backends() {  # PY WORKDIR: the packaged command through python -m
  local py=$1 w=$2
  (cd "$tmp" && "$py" -m shardload backends) >"$w/backends.txt" 2>&1 || fail "python -m shardload backends: $(cat "$w/backends.txt")"
  grep -Eq '^gloo +yes' "$w/backends.txt" || fail "gloo does not run: $(cat "$w/backends.txt")"
}

step "block 1 (pip install .): $(tr '\n' ';' <"$tmp/block1.sh")"
fresh 1
run_block "$tmp/block1.sh" "$tmp/b1/src" "$tmp/b1/venv"
site1=$("$tmp/b1/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
check_venv 1 "$site1/shardload/_lib/libshardload.so.0"

step "block 2 (a build tree, pip install ./python): $(tr '\n' ';' <"$tmp/block2.sh")"
fresh 2
run_block "$tmp/block2.sh" "$tmp/b2/src" "$tmp/b2/venv"
# as the user's shell has it after the block (its export)
export SHARDLOAD_LIBRARY=$tmp/b2/src/build/cpu/libshardload.so
grep -q 'SHARDLOAD_LIBRARY=$PWD/build/cpu/libshardload.so' "$tmp/block2.sh" || fail "block 2 no longer names the library it built"
check_venv 2 "$SHARDLOAD_LIBRARY"
step "ok: both blocks of README's 'PyTorch users' ran as written (but what is said above)"
