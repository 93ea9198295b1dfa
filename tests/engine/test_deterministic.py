"""Batch-invariant decoding (:mod:`llmsample.engine.deterministic`): a row's logits are bitwise
the same alone, beside other rows (which join and leave), from a prompt fed as a cached prefix
plus the rest (a chat's next turn), through a verification, and after a rollback — in bf16 and
float32, where the plain padded batch differs in the last bits for each of these (llama.cpp's
case: tests/engine/test_llamacpp.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from llmsample.engine.backend import Backend, open_backend
from llmsample.engine.deterministic import DeterministicBackend
from llmsample.models.loading import load_model

PROMPT = [0, 5, 9, 3, 17, 4, 8, 12, 13, 14, 6, 7, 20, 21]
FED = [30, 31, 3, 29]  # the tokens the row is fed after its prompt


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def det_lm(request: pytest.FixtureRequest, tiny_model_dir: Path) -> Any:
    return load_model(str(tiny_model_dir), "cpu", request.param)


def alone(backend: Backend) -> Tensor:
    out = [backend.admit([PROMPT])[0]]
    out += [backend.step(torch.tensor([t]))[0] for t in FED]
    return torch.stack(out)


def crowded(backend: Backend) -> Tensor:
    """Between two rows of other lengths; a fourth joins, the first leaves."""
    out = [backend.admit([[3, 4, 5], PROMPT, list(range(3, 30))])[1]]
    out.append(backend.step(torch.tensor([9, FED[0], 10]))[1])
    backend.admit([[7] * 40])
    out.append(backend.step(torch.tensor([9, FED[1], 10, 11]))[1])
    backend.keep([1, 2, 3])
    out += [backend.step(torch.tensor([t, 12, 13]))[0] for t in FED[2:]]
    return torch.stack(out)


def cached(backend: Backend) -> Tensor:
    """The prompt's start admitted, the rest verified (a session's next turn), then a draft of
    three verified and two rejected (a rollback)."""
    backend.admit([PROMPT[:5]])
    out = [backend.verify([PROMPT[5:]])[0, -1]]
    verified = backend.verify([[FED[0], FED[1], 27]])[0]
    backend.rollback(0, len(PROMPT) + 1)
    out.append(verified[0])
    out += [backend.step(torch.tensor([t]))[0] for t in FED[1:]]
    return torch.stack(out)


def copies(backend: Backend) -> Tensor:
    """The second of three copies of the prompt, rows alongside decoding other tokens."""
    out = [backend.admit_copies(PROMPT, 3)[1]]
    out += [backend.step(torch.tensor([4, t, 5]))[1] for t in FED]
    return torch.stack(out)


@pytest.mark.parametrize("way", [crowded, cached, copies])
def test_a_rows_logits_are_bitwise_the_same_however_it_is_batched(det_lm: Any, way: Callable[[Backend], Tensor]) -> None:
    check_invariant(det_lm, way)


def check_invariant(lm: Any, way: Callable[[Backend], Tensor]) -> None:
    """``way``'s logits for the row equal those of the row alone, bit for bit."""

    def fresh() -> Backend:
        return open_backend(lm, 4, 64, one_prompt=False, deterministic=True)

    assert isinstance(fresh(), DeterministicBackend)
    expected = alone(fresh())
    assert torch.equal(way(fresh()), expected)


def test_a_rollback_to_nothing_starts_the_row_afresh(det_lm: Any) -> None:
    backend = open_backend(det_lm, 2, 64, one_prompt=False, deterministic=True)
    backend.admit([[3, 4, 5, 6]])
    backend.rollback(0, 0)
    got = backend.verify([PROMPT])[0, -1]
    assert torch.equal(got, alone(open_backend(det_lm, 1, 64, one_prompt=True, deterministic=True))[0])
