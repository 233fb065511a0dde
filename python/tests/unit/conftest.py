"""Single-process tests of the Python package under pytest (python/tests/run_pytest.py; CTest
python_pytest sets SHARDLOAD_LIBRARY, PYTHONPATH and the C side's include directories). The
multi-process ones (test_api.py, test_boundary.py, test_accelerate_equiv.py) are driven as
scripts, spawning real ranks over real Gloo."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "python"))  # the package under test, without an install


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, torch):
    """A small checkpoint: several dtypes, an empty and a 0-d tensor. (path, state dict)."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    g = torch.Generator().manual_seed(18)
    sd = {
        "a.weight": torch.randn(64, 32, generator=g),
        "a.bias": torch.randn(64, generator=g).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "ids": torch.arange(12, dtype=torch.int64).reshape(6, 2),
        "scalar": torch.tensor(1.5),
        "b.weight": torch.randn(48, 16, generator=g),
    }
    path = str(tmp_path_factory.mktemp("ckpt") / "m.safetensors")
    save_file(sd, path)
    return path, sd


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under SHARDLOAD_REQUIRE_TORCH=1 (CI, scripts/test.sh) a skip is a failure: the skip rule
    of scripts/check_skips.py, which sees only CTest's verdict on the whole run."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and not hasattr(rep, "wasxfail") and os.environ.get("SHARDLOAD_REQUIRE_TORCH") == "1":
        rep.outcome = "failed"
        rep.longrepr = f"skipped under SHARDLOAD_REQUIRE_TORCH=1 (CI runs every test): {rep.longrepr}"
