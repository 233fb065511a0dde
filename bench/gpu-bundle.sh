#!/usr/bin/env bash
# The GPU check as one folder built here, to carry to a GPU machine that cannot build it (no
# network there; no Gloo, jansson, libsodium, xxhash, cmocka or pkg-config) and run there with
# bench/gpu-check.sh --bundle DIR, no build and no installer.
#
#   bash bench/gpu-bundle.sh [OPTIONS] [OUTDIR]      OUTDIR default: .gpu (git-ignored)
#     --arch LIST      CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200; e.g. "90;100")
#     --build DIR      its own build tree (default build/gpu-bundle), Release, CUDA on
#     --jobs N         build parallelism (default: the CPU count)
#   env: PYTHON (a python3 for the assembly, default python3), BUNDLE_MAX_MIB (default 16),
#        CMAKE_C_COMPILER_LAUNCHER etc. as for any CMake build (ccache)
#
# What it holds (BUNDLE, inside, lists every file and where it came from):
#   bin/shardload            the command
#   lib/                     libshardload.so.0, libshardload-cuda.so, libshardload-nccl.so and
#                            the shared libraries they and the tests need beyond the C runtime,
#                            found from the binaries' own DT_NEEDED entries (readelf), resolved
#                            by the loader (ldd), recursively: no hand list
#   tests/, run-gpu-tests.sh the programs of `ctest -L gpu` and a script that runs them as
#                            CTest would, with the bundle's paths (CTest's files hold absolute
#                            build paths)
#   bench/, python/, ...     what gpu-check.sh runs: itself, bench_accelerate.py, the python
#                            package and its Accelerate equivalence test, the gpu tests' scripts
# Not bundled: the C runtime (libc, libm, libdl, libpthread, librt, libstdc++, libgcc_s, the
# loader), which every image has, and libcuda.so.1 (the driver) and libnccl.so.2 (the system's
# or the python's nvidia-nccl wheel: gpu-check.sh finds it), which must come from the machine.
#
# Nothing depends on the path it was built at: every binary of the project is linked with
# DT_RPATH $ORIGIN/../lib (-Wl,--disable-new-dtags). DT_RPATH rather than DT_RUNPATH because
# the loader searches the DT_RPATH of the objects that loaded a library too: libgloo (copied as
# Debian built it, with no run path of its own) finds libhiredis and libibverbs in lib/ through
# libshardload's. tests/bundle/check.sh runs the command in a root holding only the C runtime.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=.gpu ARCH=90 BUILD=$SRC/build/gpu-bundle JOBS=$(nproc 2>/dev/null || echo 2)
PYTHON=${PYTHON:-python3}
die() { echo "gpu-bundle: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) ARCH=${2:?--arch needs a value}; shift 2 ;;
    --build) BUILD=${2:?--build needs a directory}; shift 2 ;;
    --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) OUT=$1; shift ;;
  esac
done
command -v "$PYTHON" >/dev/null || die "no $PYTHON (the assembly is a python script; set PYTHON=...)"
for tool in cmake readelf ldd strip; do command -v $tool >/dev/null || die "no $tool here"; done
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] || die "no nvcc (PATH, /usr/local/cuda/bin, \$CUDACXX): the CUDA and NCCL modules need the CUDA toolkit"
mkdir -p "$BUILD" && BUILD=$(cd "$BUILD" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
case "$OUT/" in "$SRC/" | "$BUILD/"* | /) die "$OUT: not a folder to (re)fill: name a new one" ;; esac
# refill only an empty folder or an earlier bundle, never anything else
if [ -n "$(ls -A "$OUT")" ] && [ ! -f "$OUT/BUNDLE" ]; then
  die "$OUT is not empty and holds no BUNDLE file: not an earlier bundle; name another folder"
fi

t0=$(date +%s)
# ---- configure: Release, CUDA on, every binary with DT_RPATH $ORIGIN/../lib ---------------
# CMake's file API says which target makes which file: the gpu tests' commands name files.
mkdir -p "$BUILD/.cmake/api/v1/query" && : >"$BUILD/.cmake/api/v1/query/codemodel-v2"
echo "gpu-bundle: configuring $BUILD (Release, CUDA architectures $ARCH)"
dtags=-Wl,--disable-new-dtags
CUDACXX=$nvcc cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSHARDLOAD_WITH_CUDA=ON \
  -DSHARDLOAD_WITH_GLOO=ON -DSHARDLOAD_BUILD_TESTS=ON -DSHARDLOAD_SANITIZE=OFF \
  "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
  "-DCMAKE_EXE_LINKER_FLAGS=$dtags" "-DCMAKE_SHARED_LINKER_FLAGS=$dtags" "-DCMAKE_MODULE_LINKER_FLAGS=$dtags" \
  >"$BUILD/gpu-bundle-configure.log" 2>&1 || { tail -n 30 "$BUILD/gpu-bundle-configure.log" >&2; die "configure failed (log: $BUILD/gpu-bundle-configure.log)"; }
ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 >"$BUILD/gpu-tests.json" 2>"$BUILD/gpu-tests.err" ||
  die "ctest -L gpu --show-only failed: $(head -c 300 "$BUILD/gpu-tests.err")"

# ---- the assembly, in python: plan (which targets), then fill OUT --------------------------
assemble() {
  "$PYTHON" - "$@" <<'PY'
import glob, json, os, re, shlex, shutil, subprocess, sys

mode, src, build, out = sys.argv[1:5]
# The C runtime every Linux image has: never bundled (a libc from another distribution would
# not match the image's loader). The vendor libraries come from the GPU machine.
RUNTIME = re.compile(r"^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|"
                     r"libutil\.so\.1|libanl\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1|ld-linux[-.\w]*\.so\.\d+|"
                     r"linux-vdso\.so\.1|linux-gate\.so\.1)$")
FROM_MACHINE = {"libcuda.so.1": "the NVIDIA driver", "libnccl.so.2": "the system's NCCL or the nvidia-nccl wheel"}


def die(msg):
    sys.exit(f"gpu-bundle: {msg}")


def targets():
    """target name -> [absolute artifact paths], from CMake's file API reply."""
    reply = os.path.join(build, ".cmake", "api", "v1", "reply")
    idx = sorted(glob.glob(os.path.join(reply, "index-*.json")))
    if not idx:
        die(f"no CMake file API reply in {reply} (CMake 3.14 or newer is needed)")
    cm = json.load(open(idx[-1]))["reply"]["codemodel-v2"]["jsonFile"]
    conf = json.load(open(os.path.join(reply, cm)))["configurations"][0]
    res = {}
    for t in conf["targets"]:
        tj = json.load(open(os.path.join(reply, t["jsonFile"])))
        res[t["name"]] = [os.path.normpath(os.path.join(build, a["path"])) for a in tj.get("artifacts", [])]
    return res


def under(p, d):
    return p == d or p.startswith(d.rstrip("/") + "/")


def ctest_program(name, wd):
    """The program of test NAME as CTest's file in WD names it (before it is built)."""
    f = os.path.join(wd, "CTestTestfile.cmake")
    m = re.search(r'add_test\(\s*\[=\[' + re.escape(name) + r'\]=\]\s+"([^"]+)"', open(f).read()) if os.path.exists(f) else None
    if not m:
        die(f"test {name}: ctest names no command yet and {f} has no add_test for it")
    return os.path.normpath(m.group(1))


def plan():
    arts = targets()
    by_file = {p: name for name, ps in arts.items() for p in ps}
    need = ("shardload_cli_install", "shardload", "shardload_cuda", "shardload_nccl")  # command, library, modules
    for t in need:
        if t not in arts or not arts[t]:
            die(f"the build defines no target {t} with a file (is SHARDLOAD_WITH_CUDA on?)")
    lib = arts["shardload"][0]
    soname = "lib/" + (soname_of(lib) or os.path.basename(lib))  # before the build: only the targets matter
    files = {  # bundle path -> build path, and what it is
        "bin/shardload": (arts["shardload_cli_install"][0], "the command"),
        soname: (lib, "the library"),
        "lib/libshardload-cuda.so": (arts["shardload_cuda"][0], "the CUDA backend module"),
        "lib/libshardload-nccl.so": (arts["shardload_nccl"][0], "the NCCL collective module"),
    }
    build_cmd = arts.get("shardload_cli", [None])[0]  # the build-tree command: its absolute RUNPATH stays there
    libs = {a: soname for a in arts["shardload"]}
    for t in ("shardload_cuda", "shardload_nccl"):
        libs[arts[t][0]] = "lib/" + os.path.basename(arts[t][0])
    build_targets = set(need)
    tests = json.load(open(os.path.join(build, "gpu-tests.json")))["tests"]
    if not tests:
        die("ctest -L gpu lists no test")

    def where(p, name, first):
        """A token of a test's command or environment, as the bundle's runner writes it."""
        if not p.startswith("/"):
            return shlex.quote(p)
        p = os.path.normpath(p)
        if p == build_cmd:
            return '"$B"/bin/shardload'
        if p == build:  # the module directory: the build root holds libshardload and the modules
            return '"$B"/lib'
        if p in libs:
            return '"$B"/' + shlex.quote(libs[p])
        if under(p, os.path.join(build, "test-tmp")):
            return '"$T"/' + shlex.quote(os.path.relpath(p, os.path.join(build, "test-tmp")))
        if p in by_file:  # a program built here: into tests/
            build_targets.add(by_file[p])
            rel = "tests/" + os.path.basename(p)
            if rel in files and files[rel][0] != p:
                die(f"two gpu test programs named {os.path.basename(p)}")
            files[rel] = (p, f"gpu test program ({name})")
            return '"$B"/' + shlex.quote(rel)
        if under(p, build):
            die(f"test {name}: {p} is in the build tree but no target makes it; the bundle cannot map it")
        if under(p, src):
            if not os.path.isfile(p):
                die(f"test {name}: {p} is in the source tree but not a file")
            rel = os.path.relpath(p, src)
            files[rel] = (p, f"from the source tree ({name})")
            return '"$B"/' + shlex.quote(rel)
        # outside both trees (an interpreter, e.g. /usr/bin/bash): by name, from the machine's PATH
        return shlex.quote(os.path.basename(p) if first else p)

    runs = []
    for t in tests:
        name = t["name"]
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        if "command" not in t:  # CTest leaves out a program that is not built yet
            if mode != "plan":
                die(f"test {name}: ctest -L gpu gives no command after the build")
            program = ctest_program(name, props.get("WORKING_DIRECTORY", build))
            if program not in by_file:
                die(f"test {name}: no target makes its program {program}")
            build_targets.add(by_file[program])
            continue
        cmd = [where(a, name, i == 0) for i, a in enumerate(t["command"])]
        env = []
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env.append(f"{k}=" + ":".join(where(x, name, False) for x in v.split(":")) if v.startswith("/") else
                       shlex.quote(kv))
        runs.append((name, int(float(props.get("TIMEOUT", 1500))), int(props.get("SKIP_RETURN_CODE", -1)), env, cmd))
    for name, _, _, env, cmd in runs:
        for tok in env + cmd:
            if build in tok or src in tok:
                die(f"test {name}: {tok} still names the build or source tree")
    # what gpu-check.sh runs
    for rel in ["bench/gpu-check.sh", "bench/bench_accelerate.py", "python/tests/test_accelerate_equiv.py", "python/tests/test_api.py",
                "python/tests/_model.py", "python/tests/_torchrun.py"] + sorted(os.path.relpath(p, src) for p in glob.glob(f"{src}/python/shardload/*.py")):
        files[rel] = (os.path.join(src, rel), "run by gpu-check.sh")
    return {"files": files, "runs": runs, "targets": sorted(build_targets), "library": soname}


RUNNER = r'''#!/usr/bin/env bash
# The bundle's `ctest -L gpu`, written by bench/gpu-bundle.sh from CTest's own list: each test's
# command, environment, timeout and skip code, with this folder's paths in place of the build's.
#   bash run-gpu-tests.sh [SCRATCH]     SCRATCH default: $TMPDIR/shardload-gpu-tests
#   SL_GPU_TEST_TIMEOUT=S caps each test's time (gpu-check.sh sets it to what its phase has left)
# Prints PASS/SKIP/FAIL per test, each test's output in SCRATCH/<name>.log; exits 0 when every
# test passed, 77 when none failed but one skipped, else 1.
set -u
B=$(cd "$(dirname "$0")" && pwd)
T=${1:-${TMPDIR:-/tmp}/shardload-gpu-tests}
mkdir -p "$T" || exit 1
T=$(cd "$T" && pwd)
pass=0 fail=0 skip=0
run() { # NAME TIMEOUT SKIP_RC [K=V...] -- COMMAND...
  local name=$1 limit=$2 skiprc=$3 env=() rc s0
  shift 3
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  if [ -n "${SL_GPU_TEST_TIMEOUT:-}" ] && [ "$SL_GPU_TEST_TIMEOUT" -lt "$limit" ]; then limit=$SL_GPU_TEST_TIMEOUT; fi
  if [ "$limit" -lt 1 ]; then echo "FAIL $name: no time left"; fail=$((fail + 1)); return; fi
  mkdir -p "$T/wd/$name"
  s0=$SECONDS
  (cd "$T/wd/$name" && exec env "${env[@]}" timeout -k 10 "$limit" "$@") >"$T/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then echo "PASS $name ($((SECONDS - s0)) s)"; pass=$((pass + 1))
  elif [ $rc -eq "$skiprc" ]; then echo "SKIP $name: $(grep -m1 -i 'skip' "$T/$name.log" | head -c 300)"; skip=$((skip + 1))
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "FAIL $name: ran past $limit s (log $T/$name.log)"; fail=$((fail + 1))
  else echo "FAIL $name: exit $rc ($((SECONDS - s0)) s): $(grep -m1 -E 'FAIL|rror|\[  FAILED' "$T/$name.log" | head -c 300) (log $T/$name.log)"; fail=$((fail + 1)); fi
}
'''


def readelf_dyn(path):
    """(NEEDED names, RPATH, RUNPATH) of an ELF file; None when it is not one."""
    r = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True)
    if r.returncode != 0 or "Dynamic section" not in r.stdout:
        return None
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)
    rp = re.findall(r"\(RPATH\)\s+Library rpath: \[([^\]]*)\]", r.stdout)
    rup = re.findall(r"\(RUNPATH\)\s+Library runpath: \[([^\]]*)\]", r.stdout)
    return needed, (rp[0] if rp else None), (rup[0] if rup else None)


def is_elf(path):
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def ldd(path):
    """name -> resolved path ('' when not found), as the loader resolves PATH's dependencies."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    r = subprocess.run(["ldd", path], capture_output=True, text=True, env=env)
    res = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            res[m.group(1)] = "" if m.group(2) == "not found" else m.group(3)
    return res


def soname_of(path):
    if not os.path.exists(path):
        return None
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]",
                  subprocess.run(["readelf", "-dW", path], capture_output=True, text=True).stdout)
    return m.group(1) if m else None


def assemble():
    p = plan()  # again, now that the files exist (the library's SONAME)
    for e in os.listdir(out):  # an earlier bundle (the script checked): made anew
        e = os.path.join(out, e)
        shutil.rmtree(e) if os.path.isdir(e) and not os.path.islink(e) else os.remove(e)
    origin = {}  # bundle path -> what it is / where it came from
    own = []
    for rel, (path, what) in sorted(p["files"].items()):
        dst = os.path.join(out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.isfile(path):
            die(f"{path} ({what}) was not built")
        shutil.copy2(path, dst)  # follows symlinks: libshardload.so.0 is the file itself
        origin[rel] = what
        if is_elf(dst):
            subprocess.run(["strip", "--strip-unneeded", dst], check=True)
            own.append(rel)
    # the shared libraries beyond the C runtime: from each ELF's DT_NEEDED, resolved by the
    # loader from the bundled copy (which searches lib/ first), recursively
    queue = list(own)
    while queue:
        rel = queue.pop(0)
        f = os.path.join(out, rel)
        needed, _, _ = readelf_dyn(f)
        resolved = None
        for name in needed:
            if RUNTIME.match(name) or os.path.exists(os.path.join(out, "lib", name)):
                continue
            if name in FROM_MACHINE:
                die(f"{rel} links {name} ({FROM_MACHINE[name]}): it must be opened at run time, never bundled")
            resolved = resolved or ldd(f)
            where = resolved.get(name, "")
            if not where:
                die(f"{rel} needs {name}, which the loader does not find here")
            dst = os.path.join(out, "lib", name)
            shutil.copy2(os.path.realpath(where), dst)
            os.chmod(dst, 0o755)
            origin["lib/" + name] = f"from {where}, needed by {rel}"
            queue.append("lib/" + name)
    # every run path names the bundle; copied libraries keep none (DT_RUNPATH there would stop
    # the loader from searching lib/ through the DT_RPATH of the objects that load them)
    glibc = set()
    for rel in sorted(origin):
        f = os.path.join(out, rel)
        if not is_elf(f):
            continue
        _, rpath, runpath = readelf_dyn(f)
        if rel in own:
            if runpath is not None or rpath is None:
                die(f"{rel}: run path RPATH={rpath} RUNPATH={runpath}; the bundle needs DT_RPATH $ORIGIN/../lib "
                    "(linked with -Wl,--disable-new-dtags and CMAKE_INSTALL_RPATH)")
        elif runpath is not None or rpath is not None:
            die(f"{rel} ({origin[rel]}) has its own run path ({rpath or runpath}): its dependencies would not be "
                "found in lib/; relink it, or strip the entry (patchelf --remove-rpath)")
        for entry in (rpath or "").split(":") if rpath is not None else []:
            if not entry.startswith("$ORIGIN"):
                die(f"{rel}: run path entry '{entry}' is not relative to $ORIGIN")
        v = subprocess.run(["readelf", "-VW", f], capture_output=True, text=True).stdout
        glibc.update(re.findall(r"Name: ((?:GLIBC|GLIBCXX|CXXABI)_[\d.]+)", v))
    # what the loader does with them: everything but the C runtime resolves inside the bundle
    for rel in sorted(origin):
        f = os.path.join(out, rel)
        if not is_elf(f) or not (rel.startswith("bin/") or rel.startswith("tests/") or rel == p["library"]):
            continue
        for name, where in ldd(f).items():
            if RUNTIME.match(name):
                continue
            if not where or not os.path.realpath(where).startswith(out + "/"):
                die(f"{rel}: the loader takes {name} from {where or 'nowhere'}, not from the bundle")
    # the gpu tests as CTest runs them
    with open(os.path.join(out, "run-gpu-tests.sh"), "w") as fh:
        fh.write(RUNNER)
        for name, limit, skiprc, env, cmd in p["runs"]:
            fh.write(f"run {shlex.quote(name)} {limit} {skiprc} {' '.join(env)} -- {' '.join(cmd)}\n")
        fh.write('echo "gpu tests: $pass passed, $fail failed, $skip skipped"\n'
                 '[ $fail -eq 0 ] || exit 1\n[ $skip -eq 0 ] || exit 77\nexit 0\n')
    os.chmod(os.path.join(out, "run-gpu-tests.sh"), 0o755)
    origin["run-gpu-tests.sh"] = "runs the gpu tests (ctest -L gpu) from the bundle"
    for rel in p["files"]:
        if rel.endswith(".sh"):
            os.chmod(os.path.join(out, rel), 0o755)

    def vkey(s):
        return tuple(int(x) for x in s.split("_", 1)[1].split("."))
    needs = []
    for fam in ("GLIBC", "GLIBCXX", "CXXABI"):
        vs = sorted((x for x in glibc if x.startswith(fam + "_")), key=vkey)
        if vs:
            needs.append(vs[-1])
    git = subprocess.run(["git", "-C", src, "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True,
                         text=True).stdout.strip() or "unknown"
    osname = "unknown"
    if os.path.exists("/etc/os-release"):
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)', open("/etc/os-release").read(), re.M)
        osname = m.group(1) if m else osname
    total = 0
    lines = []
    for rel in sorted(origin):
        n = os.path.getsize(os.path.join(out, rel))
        total += n
        lines.append(f"  {rel}  {n}  {origin[rel]}")
    with open(os.path.join(out, "BUNDLE"), "w") as fh:
        fh.write(f"shardload GPU bundle, made by bench/gpu-bundle.sh; run: bash bench/gpu-check.sh --bundle DIR\n"
                 f"commit: {git}\nbuilt on: {osname}\ncuda architectures: {os.environ['SL_BUNDLE_ARCH']}\n"
                 f"needs: {' '.join(needs)} (the image's libc and libstdc++ must have these versions)\n"
                 f"not bundled: the C runtime; {', '.join(f'{k} ({v})' for k, v in FROM_MACHINE.items())}\n"
                 f"files ({len(lines)}, {total} bytes):\n" + "\n".join(lines) + "\n")
    # no text file names the build or source tree (the run path and the runner were the risk)
    for rel in origin:
        f = os.path.join(out, rel)
        if not is_elf(f) and (src.encode() in open(f, "rb").read() or build.encode() in open(f, "rb").read()):
            die(f"{rel} names {src} or {build}")
    print(total)


if mode == "plan":
    print(" ".join(plan()["targets"]))
else:
    assemble()
PY
}
targets=$(assemble plan "$SRC" "$BUILD" "$OUT") || exit 1
echo "gpu-bundle: building $targets (-j$JOBS)"
# shellcheck disable=SC2086  # the target list is words
cmake --build "$BUILD" -j "$JOBS" --target $targets >"$BUILD/gpu-bundle-build.log" 2>&1 ||
  { grep -m5 -E 'error|Error' "$BUILD/gpu-bundle-build.log" >&2; die "build failed (log: $BUILD/gpu-bundle-build.log)"; }
ctest --test-dir "$BUILD" -L gpu --show-only=json-v1 >"$BUILD/gpu-tests.json" 2>"$BUILD/gpu-tests.err" ||
  die "ctest -L gpu --show-only failed: $(head -c 300 "$BUILD/gpu-tests.err")"
bytes=$(SL_BUNDLE_ARCH=$ARCH assemble assemble "$SRC" "$BUILD" "$OUT") || exit 1
max=$(( ${BUNDLE_MAX_MIB:-16} * 1048576 ))
[ "$bytes" -lt "$max" ] || die "$OUT holds $bytes bytes, over ${BUNDLE_MAX_MIB:-16} MiB: what grew? (see $OUT/BUNDLE)"
echo "gpu-bundle: $OUT: $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b / 1048576}') in $(grep -c '^  ' "$OUT/BUNDLE") files, needs $(sed -n 's/^needs: \([^(]*\) (.*/\1/p' "$OUT/BUNDLE"), in $(( $(date +%s) - t0 )) s"
echo "gpu-bundle: carry $OUT to the GPU machine, then: bash $(basename "$OUT")/bench/gpu-check.sh --bundle $(basename "$OUT")"
