"""docs/python.md's examples, run as written on the default model (in one namespace, in order)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).parents[2] / "docs" / "python.md"


@pytest.mark.model
def test_the_examples_run_as_printed() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), namespace)
    assert "Paris" in out.getvalue()
    assert namespace["stream"].result is not None and len(namespace["results"]) == 2
