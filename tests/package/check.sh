#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds examples/load_example.c against it
# through find_package(shardload) and through pkg-config, and runs both on a small checkpoint.
# Then builds loadable backends out of tree against the installed headers alone, as a vendor
# module would be: tests/modules/hostmem.c (ABI v2) by hand, and the example module
# (examples/module/, ABI v1 and v2) through find_package(shardload) and shardload_add_module();
# each loads the checkpoint through SHARDLOAD_MODULE_PATH, and the example passes the backend
# conformance suite through both of its entries (docs/MODULES.md).
# (the frozen shardload/module_v1.h is installed for the v1 entry)
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

# Loads the checkpoint with backend NAME from DIR; the report must name it.
load_with() {
  local name="$1" dir="$2" out
  out=$(SHARDLOAD_MODULE_PATH="$dir" LD_LIBRARY_PATH="$scratch/prefix/lib" \
        "$scratch/prefix/bin/shardload" load "$scratch/ck.safetensors" --backend "$name" --json 2>&1) ||
    { echo "load --backend $name failed: $out"; exit 1; }
  echo "$out" | grep -q "\"$name" || { echo "load --backend $name: the report does not name the module: $out"; exit 1; }
  echo "$out" | grep -q "model.embed_tokens.weight" || { echo "load --backend $name: unexpected output: $out"; exit 1; }
}

# The exported symbols of a module file, sorted, one line.
exports_of() { nm -D --defined-only "$1" | awk '{print $3}' | sort | tr '\n' ' '; }

# The out-of-tree module by hand: only the installed include directory, no link against
# libshardload (-z defs: it needs nothing from it), only its entry symbol exported.
for h in module.h module_util.h; do
  test -f "$scratch/prefix/include/shardload/$h" || { echo "shardload/$h is not installed"; exit 1; }
done
mkdir -p "$scratch/modules"
"$cc" -std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -shared -fPIC -fvisibility=hidden \
  -I"$scratch/prefix/include" "$src/tests/modules/hostmem.c" -Wl,-z,defs \
  -o "$scratch/modules/libshardload-hostmem.so"
exports=$(exports_of "$scratch/modules/libshardload-hostmem.so")
[ "$exports" = "sl_backend_module_v2 " ] || { echo "hostmem module exports: $exports"; exit 1; }
load_with hostmem "$scratch/modules"
echo "package: an out-of-tree ABI v2 backend built against the installed headers loaded the checkpoint"

# The example module through the installed CMake package: shardload_add_module() gives the file
# name, the exports, -z defs and the install rule.
test -f "$scratch/prefix/include/shardload/module_v1.h" || { echo "module_v1.h is not installed"; exit 1; }
cmake -S "$src/examples/module" -B "$scratch/demo" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="-Werror" >/dev/null
cmake --build "$scratch/demo" >/dev/null
cmake --install "$scratch/demo" --prefix "$scratch/demo-prefix" >/dev/null
demo=$(ls "$scratch"/demo-prefix/lib*/libshardload-demo.so)
exports=$(exports_of "$demo")
[ "$exports" = "sl_backend_module sl_backend_module_v2 " ] || { echo "demo module exports: $exports"; exit 1; }
readelf -d "$demo" | grep -q NEEDED.*libshardload && { echo "the demo module links libshardload"; exit 1; }
load_with demo "$(dirname "$demo")"
suite="$build/tests/conformance/conformance_backend"
if [ -x "$suite" ]; then
  for entry in "" --v1; do
    "$suite" $entry "$demo" >"$scratch/demo-suite.log" 2>&1 ||
      { cat "$scratch/demo-suite.log"; echo "the backend conformance suite failed on the example module ($entry)"; exit 1; }
  done
  echo "package: the example module passed the backend conformance suite through both entries"
fi
echo "package: the example module (ABI v1 and v2), built out of tree with shardload_add_module, loaded the checkpoint"
