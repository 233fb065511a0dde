#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds examples/load_example.c against it
# through find_package(shardload) and through pkg-config, and runs both on a small checkpoint.
# Then builds a loadable backend out of tree against the installed headers alone (shardload/
# module.h; tests/modules/hostmem.c, ABI v2) and loads the checkpoint with it through
# SHARDLOAD_MODULE_PATH, as a vendor module would be; and the same module exporting both ABI
# versions from one binary (the frozen shardload/module_v1.h, installed too).
set -euo pipefail
build="$1" src="$2" scratch="$3" cc="${4:-cc}"
rm -rf "$scratch" && mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
export PKG_CONFIG_PATH="$scratch/prefix/lib/pkgconfig:$scratch/prefix/lib64/pkgconfig"
cmake -S "$src/tests/package" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DEXAMPLE_SOURCE="$src/examples/load_example.c" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
"$scratch/prefix/bin/shardload" synth "$scratch/ck.safetensors" --size 1MiB >/dev/null
for exe in consumer_cmake consumer_pkgconfig; do
  out=$(LD_LIBRARY_PATH="$scratch/prefix/lib" "$scratch/consumer/$exe" "$scratch/ck.safetensors")
  echo "$out" | grep -q "model.embed_tokens.weight" || { echo "$exe: unexpected output: $out"; exit 1; }
done
echo "package: find_package and pkg-config consumers built and loaded a checkpoint"

# The out-of-tree module: only the installed include directory, no link against libshardload
# (-z defs: it needs nothing from it), only its entry symbol exported.
test -f "$scratch/prefix/include/shardload/module.h" || { echo "module.h is not installed"; exit 1; }
mkdir -p "$scratch/modules"
"$cc" -std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
  -I"$scratch/prefix/include" "$src/tests/modules/hostmem.c" -Wl,-z,defs \
  -o "$scratch/modules/libshardload-hostmem.so"
exports=$(nm -D --defined-only "$scratch/modules/libshardload-hostmem.so" | awk '{print $3}' | tr '\n' ' ')
[ "$exports" = "sl_backend_module_v2 " ] || { echo "hostmem module exports: $exports"; exit 1; }
out=$(SHARDLOAD_MODULE_PATH="$scratch/modules" LD_LIBRARY_PATH="$scratch/prefix/lib" \
      "$scratch/prefix/bin/shardload" load "$scratch/ck.safetensors" --backend hostmem --json 2>&1) ||
  { echo "load --backend hostmem failed: $out"; exit 1; }
echo "$out" | grep -q '"hostmem' || { echo "load --backend hostmem: the report does not name the module: $out"; exit 1; }
echo "$out" | grep -q "model.embed_tokens.weight" || { echo "load --backend hostmem: unexpected output: $out"; exit 1; }
echo "package: an out-of-tree ABI v2 backend built against the installed headers loaded the checkpoint"

# One binary, both entry symbols: v2 for this core, v1 for a core that knows only the first ABI.
test -f "$scratch/prefix/include/shardload/module_v1.h" || { echo "module_v1.h is not installed"; exit 1; }
"$cc" -std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
  -I"$scratch/prefix/include" -DSL_TEST_DUAL -DSL_TEST_NAME='"hostdual"' "$src/tests/modules/hostmem.c" \
  -Wl,-z,defs -o "$scratch/modules/libshardload-hostdual.so"
exports=$(nm -D --defined-only "$scratch/modules/libshardload-hostdual.so" | awk '{print $3}' | sort | tr '\n' ' ')
[ "$exports" = "sl_backend_module sl_backend_module_v2 " ] || { echo "hostdual module exports: $exports"; exit 1; }
out=$(SHARDLOAD_MODULE_PATH="$scratch/modules" LD_LIBRARY_PATH="$scratch/prefix/lib" \
      "$scratch/prefix/bin/shardload" load "$scratch/ck.safetensors" --backend hostdual --json 2>&1) ||
  { echo "load --backend hostdual failed: $out"; exit 1; }
echo "$out" | grep -q "model.embed_tokens.weight" || { echo "load --backend hostdual: unexpected output: $out"; exit 1; }
echo "package: an out-of-tree module exporting ABI v1 and v2, built against the installed headers, loaded"
