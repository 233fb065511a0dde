#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, builds examples/load_example.c against it
# through find_package(shardload) and through pkg-config, and runs both on a small checkpoint.
set -euo pipefail
build="$1" src="$2" scratch="$3"
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
