#!/usr/bin/env bash
# A root filesystem with only the C runtime and Python (Debian 12 minbase + python3 and
# python3-venv: no -dev package, no compiler, no build tree), built once and cached:
#   rootfs.sh DIR       prints DIR when it is ready (DIR/.shardload-rootfs-ok marks it)
# debootstrap from deb.debian.org (or $SHARDLOAD_DEBIAN_MIRROR); ~30 MB to fetch, ~1-2 min.
# Needs root (debootstrap chroots) and debootstrap (scripts/deps.sh --package installs it).
# Where the mirror cannot be reached (or SHARDLOAD_ROOTFS=host) it says so and assembles the
# root from this machine's Debian python3.11 and the libraries ldd names instead (from_host).
set -euo pipefail
dir=${1:?usage: rootfs.sh DIR}
mirror=${SHARDLOAD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# debootstrap writes no /etc/hosts: without one "localhost" (torchrun's rendezvous) resolves to nothing
hosts() { [ -s "$1/etc/hosts" ] || printf '127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n' "$(hostname)" >"$1/etc/hosts"; }
if [ -f "$dir/.shardload-rootfs-ok" ]; then hosts "$dir"; echo "$dir"; exit 0; fi
[ "$(id -u)" -eq 0 ] || { echo "rootfs: debootstrap needs root" >&2; exit 2; }
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"

# The fallback where no mirror answers (or SHARDLOAD_ROOTFS=host): a root assembled from this
# machine's own Debian python3.11 (its stdlib and ensurepip's wheels), a shell and the few
# tools the check runs, and exactly the shared libraries these need (ldd), plus the rest of the
# C runtime (libstdc++, libgcc_s, libdl, libpthread, librt, ...): no /usr of the host, no -dev package.
from_host() {
  local r=$1 py=/usr/bin/python3.11
  [ -x "$py" ] && [ -d /usr/lib/python3.11/venv ] && [ -d /usr/share/python-wheels ] ||
    { echo "rootfs: no Debian python3.11 with venv here to assemble a root from" >&2; return 1; }
  mkdir -p "$r"/{bin,etc,tmp,proc,dev,opt,usr/bin,usr/lib,usr/share,sbin} && chmod 1777 "$r/tmp"
  local progs=("$py" /bin/bash /usr/bin/env /bin/cat /bin/grep /bin/mkdir /bin/ls /bin/rm /bin/cp /bin/ln
               /usr/bin/timeout /usr/bin/head /usr/bin/tail /usr/bin/cut /bin/sed /usr/bin/dirname /sbin/ldconfig)
  local p lib
  for p in "${progs[@]}"; do cp -L "$p" "$r/usr/bin/" || return 1; done
  ln -s python3.11 "$r/usr/bin/python3"; ln -s bash "$r/usr/bin/sh"
  for p in "$r"/usr/bin/*; do ln -sf "/usr/bin/$(basename "$p")" "$r/bin/$(basename "$p")" 2>/dev/null || true; done
  ln -sf /usr/bin/ldconfig "$r/sbin/ldconfig"
  cp -a /usr/lib/python3.11 "$r/usr/lib/" && cp -a /usr/share/python-wheels "$r/usr/share/" || return 1
  rm -rf "$r/usr/lib/python3.11/test" "$r/usr/lib/python3.11/config-"*
  # every library the programs and the stdlib's extension modules load, at the same paths
  local m=/lib/x86_64-linux-gnu
  for p in "${progs[@]}" /usr/lib/python3.11/lib-dynload/*.so /usr/lib/x86_64-linux-gnu/libstdc++.so.6 \
           /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 $m/libdl.so.2 $m/libpthread.so.0 $m/librt.so.1 \
           $m/libutil.so.1 $m/libanl.so.1 $m/libresolv.so.2; do
    for lib in $(ldd "$p" 2>/dev/null | grep -o '/[^ ]*') "$p"; do
      case "$lib" in /usr/bin/* | /bin/* | /sbin/* | /usr/lib/python3.11/*) continue ;; esac
      mkdir -p "$r$(dirname "$lib")" && cp -L "$lib" "$r$lib" || return 1
    done
  done
  [ -e "$r/lib64" ] || ln -s usr/lib64 "$r/lib64"
  [ -e "$r/lib" ] || ln -s usr/lib "$r/lib"
  printf 'root:x:0:0:root:/root:/bin/bash\n' >"$r/etc/passwd"
  "$r/usr/bin/ldconfig" -r "$r" 2>/dev/null || true
}

if [ "${SHARDLOAD_ROOTFS:-debootstrap}" = host ]; then
  echo "rootfs: SHARDLOAD_ROOTFS=host: assembling the root from this machine's python3.11 (ldd)" >&2
  from_host "$dir.tmp" || exit 1
elif ! command -v debootstrap >/dev/null; then
  echo "rootfs: no debootstrap (scripts/deps.sh --package installs it)" >&2; exit 2
# minbase: essential packages and apt; python3-venv brings ensurepip's wheels, nothing to build with
elif ! debootstrap --variant=minbase --include=python3,python3-venv bookworm "$dir.tmp" "$mirror" >"$dir.tmp.log" 2>&1; then
  tail -n 5 "$dir.tmp.log" >&2
  echo "rootfs: debootstrap from $mirror failed (log $dir.tmp.log; set SHARDLOAD_DEBIAN_MIRROR to a reachable" \
       "mirror): falling back to a root assembled from this machine's python3.11 (ldd)" >&2
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp" && from_host "$dir.tmp" || exit 1
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
