"""Runs the single-process tests (python/tests/unit) under pytest, as CTest's python_pytest does.

    python python/tests/run_pytest.py [pytest arguments]    (SHARDLOAD_LIBRARY / PYTHONPATH as ctest sets)
Exit 77 where pytest, torch or safetensors is missing, unless SHARDLOAD_REQUIRE_TORCH=1
(scripts/deps.sh --python installs them all).
"""

from __future__ import annotations

import os
import sys

try:
    import pytest
    import safetensors  # noqa: F401
    import torch  # noqa: F401
except Exception as e:  # pragma: no cover
    print(f"skipped: pytest/torch/safetensors not importable ({e}); scripts/deps.sh --python installs them")
    sys.exit(1 if os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1" else 77)

if __name__ == "__main__":
    unit = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit")
    # no cache directory in the source tree; the slowest tests named, to keep the suite fast
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--durations=5", unit] + sys.argv[1:]))
