#!/usr/bin/env python3
"""check_docs.py can fail (CTest docs_check_plants, label docs): a small tree that passes, then
the same tree with one violation of each kind planted in turn; each must fail naming the file,
the line and what is wrong, and nothing else. Python 3 standard library only.

Usage: test_plants.py [TMP_DIR]
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK = os.path.join(HERE, "check_docs.py")
MD = ".md"  # spelt apart so that this file cites no anchor of the real tree

FENCE = "`" * 3

# The clean tree: every kind of reference the check follows, each one right.
CLEAN = {
    "README.md": f"""# demo

Placement: [the contract](docs/DESIGN{MD}#placement); below: [Usage](#usage).

## Usage

{FENCE}sh
demo load /tmp/ck --nproc 2
{FENCE}

`core/src/demo.c` holds `demo_load`; `CMakeLists.txt` builds it.
""",
    "CMakeLists.txt": "# see docs/DESIGN" + MD + "#placement\n# and docs/DESIGN" + MD + '#data-flow, "Routes"\n',
    "docs/DESIGN.md": """# Design

## <a id="placement"></a>1. Placement

Placement rules.

## Data flow

**Routes.** Host or device.

`core/src/demo.c:demo_load` reads `DEMO_HOME`; the walk: `loader_pipe.c:pipe_step`.
""",
    "docs/ENVIRONMENT.md": """# Environment

| variable | read by | what it does | default |
|---|---|---|---|
| `SHARDLOAD_DEMO` | core | demo | unset |
| `SHARDLOAD_PY`, `WORLD_SIZE` | python | demo | unset |

## Test hooks

| variable | read by | what it does | default |
|---|---|---|---|
| `SHARDLOAD_TEST_DEMO` | tests/hooks.c | demo | unset |
""",
    "core/src/demo.c": """/* demo (docs/DESIGN""" + MD + """#placement) */
#include <stdlib.h>
int demo_load(void) { return getenv("SHARDLOAD_DEMO") != NULL; }
""",
    "core/src/deep/loader_pipe.c": "int pipe_step(int x) { return x; }\n",
    "python/shardload/demo.py": """import os
A = os.environ.get("SHARDLOAD_PY")
B = os.environ["WORLD_SIZE"]
os.environ["SHARDLOAD_SET_ONLY"] = "1"  # written, not read: needs no row
""",
    "tests/hooks.c": '#include <stdlib.h>\nint hook(void) { return getenv("SHARDLOAD_TEST_DEMO") != 0; }\n',
}

# (name, {file: new text or (old, new)}, what the one failure must say)
PLANTS = [
    ("anchor: a cited section that is gone",
     {"core/src/demo.c": ("#placement) */", "#place" + "ments) */")},
     ["core/src/demo.c:1:", "[anchor]", "DESIGN" + MD + "#placements", "has no heading or <a id> 'placements'"]),
    ("anchor: a named paragraph that is in another section",
     {"CMakeLists.txt": "# see docs/DESIGN" + MD + '#placement, "Routes"\n'},
     ["CMakeLists.txt:1:", "[anchor]", "has no paragraph or heading \"Routes\""]),
    ("anchor: a cited file that is gone",
     {"CMakeLists.txt": "# see docs/LAYOUT" + MD + "#placement\n"},
     ["CMakeLists.txt:1:", "[anchor]", "no file docs/LAYOUT.md"]),
    ("anchor: an in-page link to a section moved elsewhere",
     {"README.md": ("## Usage", "## Using it")},
     ["README.md:3:", "[anchor]", "(#usage)", "has no heading"]),
    ("sh: a block that no longer parses",
     {"README.md": ("demo load /tmp/ck --nproc 2\n", "demo load /tmp/ck --nproc 2\nif true; then echo half\n")},
     ["README.md:", "[sh]", "does not parse", "bash -n"]),
    ("function: a file:function whose function is gone",
     {"core/src/demo.c": ("int demo_load(void)", "int demo_open(void)")},
     ["docs/DESIGN.md:11:", "[function]", "core/src/demo.c:demo_load", "has no function demo_load"]),
    ("function: a bare file:function whose file was renamed",
     {"core/src/deep/loader_pipe.c": None, "core/src/deep/loader_flow.c": "int pipe_step(int x) { return x; }\n"},
     ["docs/DESIGN.md:11:", "[function]", "loader_pipe.c:pipe_step", "no file loader_pipe.c"]),
    ("env: a variable read but not in the table",
     {"core/src/demo.c": ('getenv("SHARDLOAD_DEMO") != NULL;',
                          'getenv("SHARDLOAD_DEMO") != NULL && getenv("SHARDLOAD_NEW");')},
     ["core/src/demo.c:3:", "[env]", "SHARDLOAD_NEW is read here but is not in docs/ENVIRONMENT.md"]),
    ("env: a table row nothing reads",
     {"python/shardload/demo.py": ('A = os.environ.get("SHARDLOAD_PY")\n', "A = None\n")},
     ["docs/ENVIRONMENT.md:6:", "[env]", "SHARDLOAD_PY is in the table but nothing in the tree reads it"]),
    ("env: a test hook read by the shipped code",
     {"core/src/demo.c": ('getenv("SHARDLOAD_DEMO") != NULL;',
                          'getenv("SHARDLOAD_DEMO") != NULL || getenv("SHARDLOAD_TEST_DEMO");')},
     ["core/src/demo.c:3:", "[env]", "SHARDLOAD_TEST_DEMO is a test hook"]),
    ("path: a path in backticks that does not exist",
     {"README.md": ("`core/src/demo.c` holds", "`core/src/demo_gone.c` holds")},
     ["README.md:11:", "[path]", "`core/src/demo_gone.c` does not exist"]),
    ("path: a relative link to a file that moved",
     {"docs/DESIGN.md": ("Placement rules.", "Placement rules; see [the README](README.md).")},
     ["docs/DESIGN.md:5:", "[path]", "link (README.md): no docs/README.md"]),
    ("path: a top-level file that does not exist",
     {"README.md": ("`CMakeLists.txt` builds it", "`CONTRIBUTING.md` says how")},
     ["README.md:11:", "[path]", "`CONTRIBUTING.md` does not exist"]),
]


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def run(root):
    r = subprocess.run([sys.executable, CHECK, "--root", root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main(argv):
    base = argv[0] if argv else tempfile.mkdtemp(prefix="docs-plants-")
    failures = 0
    clean = os.path.join(base, "clean")
    shutil.rmtree(clean, ignore_errors=True)
    write_tree(clean, CLEAN)
    rc, out = run(clean)
    if rc != 0:
        print(f"FAIL: the clean tree does not pass (exit {rc}):\n{out}")
        return 1
    print("ok: the clean tree passes")
    for i, (name, change, want) in enumerate(PLANTS):
        root = os.path.join(base, f"plant{i}")
        shutil.rmtree(root, ignore_errors=True)
        files = dict(CLEAN)
        for rel, edit in change.items():
            if edit is None:
                del files[rel]
            elif isinstance(edit, tuple):
                assert edit[0] in files[rel], f"plant '{name}': '{edit[0]}' not in {rel}"
                files[rel] = files[rel].replace(edit[0], edit[1])
            else:
                files[rel] = edit
        write_tree(root, files)
        rc, out = run(root)
        findings = [l for l in out.splitlines() if ": [" in l]
        missing = [w for w in want if not any(w in f for f in findings)]
        if rc != 1 or len(findings) != 1 or missing:
            failures += 1
            print(f"FAIL: {name}: exit {rc}, {len(findings)} finding(s), want exit 1 and one naming "
                  f"{missing or want}:\n{out}")
        else:
            print(f"ok: {name}: {findings[0]}")
    if failures:
        print(f"{failures} of {len(PLANTS)} plants not caught as they should be")
        return 1
    print(f"all {len(PLANTS)} plants caught, each with its file, line and remedy")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
