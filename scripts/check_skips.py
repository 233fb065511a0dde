#!/usr/bin/env python3
"""The skip rule of scripts/test.sh: only tests labelled gpu, amdgpu or intelgpu may report
SKIPPED (where no such GPU is usable). Reads the JUnit file ctest wrote (--output-junit) and the
tests' labels (ctest --show-only=json-v1 in BUILD_DIR); lists every skipped test and fails when
one lacks those labels.

    check_skips.py BUILD_DIR JUNIT_FILE
"""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

MAY_SKIP = {"gpu", "amdgpu", "intelgpu"}


def labels_of(build_dir):
    out = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    labels = {}
    for t in json.loads(out).get("tests", []):
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = set(p.get("value") or [])
        labels.setdefault(t["name"], set())
    return labels


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build_dir, junit = sys.argv[1], sys.argv[2]
    labels = labels_of(build_dir)
    skipped = [tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")
               if tc.find("skipped") is not None or tc.get("status") == "notrun"]
    bad = [n for n in skipped if not labels.get(n, set()) & MAY_SKIP]
    for n in skipped:
        why = "allowed" if n not in bad else "NOT ALLOWED"
        print(f"check_skips: skipped: {n} (labels {', '.join(sorted(labels.get(n, set()))) or 'none'}): {why}")
    if bad:
        print(f"check_skips: {len(bad)} test(s) skipped without a gpu, amdgpu or intelgpu label: {', '.join(bad)}; "
              "a skip there hides a test that should run on this machine (see its output: "
              f"ctest --test-dir {build_dir} -R '^({'|'.join(bad)})$' --output-on-failure)", file=sys.stderr)
        return 1
    print(f"check_skips: {len(skipped)} skipped, all labelled gpu, amdgpu or intelgpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
