#!/usr/bin/env bash
# A root filesystem with only the C runtime and Python (Debian 12 minbase + python3 and
# python3-venv: no -dev package, no compiler, no build tree), built once and cached:
#   rootfs.sh DIR       prints DIR when it is ready (DIR/.shardload-rootfs-ok marks it)
# debootstrap from deb.debian.org (or $SHARDLOAD_DEBIAN_MIRROR); ~30 MB to fetch, ~1-2 min.
# Needs root (debootstrap chroots) and debootstrap (scripts/deps.sh --package installs it).
set -euo pipefail
dir=${1:?usage: rootfs.sh DIR}
mirror=${SHARDLOAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# debootstrap writes no /etc/hosts: without one "localhost" (torchrun's rendezvous) resolves to nothing
hosts() { [ -s "$1/etc/hosts" ] || printf '127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n' "$(hostname)" >"$1/etc/hosts"; }
if [ -f "$dir/.shardload-rootfs-ok" ]; then hosts "$dir"; echo "$dir"; exit 0; fi
command -v debootstrap >/dev/null || { echo "rootfs: no debootstrap (scripts/deps.sh --package installs it)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "rootfs: debootstrap needs root" >&2; exit 2; }
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
# minbase: essential packages and apt; python3-venv brings ensurepip's wheels, nothing to build with
if ! debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir.tmp" "$mirror" >"$dir.tmp.log" 2>&1; then
  tail -n 20 "$dir.tmp.log" >&2
  echo "rootfs: debootstrap from $mirror failed (log $dir.tmp.log); set SHARDLOAD_DEBIAN_MIRROR to a reachable mirror" >&2
  exit 1
fi
# what the root must not have: a compiler, the -dev packages the build uses
for f in usr/bin/gcc usr/bin/cc usr/bin/cmake usr/include/jansson.h usr/include/sodium.h usr/include/gloo usr/include/xxhash.h; do
  [ ! -e "$dir.tmp/$f" ] || { echo "rootfs: $dir.tmp has /$f: not a minimal root" >&2; exit 1; }
done
rm -rf "$dir.tmp/var/cache/apt/archives"/*.deb
hosts "$dir.tmp"
touch "$dir.tmp/.shardload-rootfs-ok"
rm -rf "$dir" && mv "$dir.tmp" "$dir" && rm -f "$dir.tmp.log"
echo "$dir"
