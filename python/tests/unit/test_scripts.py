"""The single-process parts of test_api.py and test_boundary.py, driven by pytest (each a
function of those scripts, listed in their SINGLE_PROCESS; the scripts run the parts with real
ranks, signals and planted modules as CTest python_api / python_boundary)."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # python/tests, where the scripts live

import test_api  # noqa: E402
import test_boundary  # noqa: E402


@pytest.fixture(scope="module")
def api_checkpoint(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("api"))
    sd, path = test_api.checkpoint(tmp)
    return tmp, sd, path


@pytest.mark.parametrize("name", test_api.SINGLE_PROCESS)
def test_api_part(name, api_checkpoint):
    checks = test_api.CHECKS
    getattr(test_api, name)(*api_checkpoint)
    assert test_api.CHECKS > checks, f"test_api.{name} checked nothing"


@pytest.fixture(scope="module")
def boundary_checkpoint(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("boundary"))
    path = os.path.join(tmp, "m.safetensors")
    test_boundary.save_file({"w": test_boundary.torch.arange(35, dtype=test_boundary.torch.float32).reshape(7, 5)},
                            path)
    return tmp, path


@pytest.mark.parametrize("name", test_boundary.SINGLE_PROCESS)
def test_boundary_part(name, boundary_checkpoint):
    checks = test_boundary.CHECKS
    getattr(test_boundary, name)(*boundary_checkpoint)
    assert test_boundary.CHECKS > checks, f"test_boundary.{name} checked nothing"
