"""The records and the renderers are plain data and text: importing them loads no torch (a
renderer cannot reach for the model, and scripts that only read events start fast)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

MODULES = [
    "llmsample.events",
    "llmsample.render.bands",
    "llmsample.render.html",
    "llmsample.render.inspect",
    "llmsample.render.jsonout",
    "llmsample.render.stream",
    "llmsample.sampling.stages",
    "llmsample.batch.requests",
    "llmsample.batch.result_lines",
    "llmsample.batch.resume",
    "llmsample.batch.output",
    "llmsample.batch.distributed",
]


@pytest.mark.parametrize("module", MODULES)
def test_imports_without_torch(module: str) -> None:
    # With torch blocked, any import of it (direct or through another module) raises ImportError.
    code = f"import sys; sys.modules['torch'] = None; import {module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


def test_the_check_can_fail() -> None:
    code = "import sys; sys.modules['torch'] = None; import llmsample.sampling.figures"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode != 0 and "torch" in result.stderr
