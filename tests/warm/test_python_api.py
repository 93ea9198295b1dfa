"""``llmsample.Engine.connect``: the Python API on a warm engine answers as the in-process engine
does (the same tokens and explain's same figures for a seed), and says what it cannot do."""

from __future__ import annotations

from pathlib import Path

import pytest

import llmsample
from llmsample.errors import UserError
from tests.warm.conftest import Engine


@pytest.fixture(scope="module")
def both(engine: Engine) -> tuple[llmsample.Engine, llmsample.Engine]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_RUNTIME_DIR", str(engine.runtime))
        warm = llmsample.Engine.connect(model=str(engine.model), device="cpu", dtype="float32")
    return warm, llmsample.Engine(model=str(engine.model), device="cpu", dtype="float32")


def test_the_same_tokens_and_figures_as_in_process(both: tuple[llmsample.Engine, llmsample.Engine]) -> None:
    warm, local = both
    settings = {"seed": 9, "max_tokens": 14, "preset": "creative", "top_n": 3, "system": "w9"}
    ours, theirs = warm.generate("w3 w4 w5", **settings), local.generate("w3 w4 w5", **settings)
    assert ours.tokens == theirs.tokens and len(ours.tokens) > 3
    assert ours.summary.facts.engine.startswith("unix:") and theirs.summary.facts.engine is None
    assert warm.explain("w3 w4", raw=True, top_k=4) == local.explain("w3 w4", raw=True, top_k=4)
    assert warm.explain("w3 w4", "w5 w6", raw=True) == local.explain("w3 w4", "w5 w6", raw=True)
    rows = warm.batch(["w3", "w6 w7"], seed=2, max_tokens=6)
    assert [len(row.tokens) for row in rows] == [len(r.tokens) for r in local.batch(["w3", "w6 w7"], seed=2, max_tokens=6)]


def test_watch_and_a_bad_one(both: tuple[llmsample.Engine, llmsample.Engine]) -> None:
    warm, local = both
    settings = {"seed": 1, "max_tokens": 6, "watch": ["w5", "<eos>"], "ignore_eos": True}
    assert warm.generate("w3", **settings).tokens == local.generate("w3", **settings).tokens
    with pytest.raises(UserError, match="--watch"):
        warm.generate("w3", watch=["w4 w5"], max_tokens=3)
    assert warm.status()["capabilities"] == [] and warm.generate("w3", max_tokens=2, ignore_eos=True).summary.tokens == 2


def test_no_warm_engine_is_a_runtime_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no warm engine serves"):
        llmsample.Engine.connect(model=str(tmp_path))

