"""The reductions the chain and the step figures run over every row: the same answers as torch's
plain ones, ties, NaN and infinities included."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling.filters import count_true, first_argmax, kept_count

SPECIAL = (-math.inf, math.inf, math.nan)


@st.composite
def logits(draw: st.DrawFn) -> torch.Tensor:
    """Rows of few distinct values (ties everywhere), with -inf, +inf and NaN dropped in; widths
    that split into blocks of 256, 128 or 64, and one that does not."""
    rows = draw(st.integers(1, 3))
    vocab = draw(st.sampled_from([512, 768, 2048, 4096, 1000]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    x = torch.randint(0, draw(st.integers(1, 4)), (rows, vocab), generator=generator).float()
    for _ in range(draw(st.integers(0, 4))):
        x[draw(st.integers(0, rows - 1)), draw(st.integers(0, vocab - 1))] = draw(st.sampled_from(SPECIAL))
    if draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = -math.inf  # a row with nothing left
    return x


@settings(max_examples=200, deadline=None)
@given(logits())
def test_first_argmax_is_torchs_argmax(x: torch.Tensor) -> None:
    assert torch.equal(first_argmax(x), x.argmax(-1, keepdim=True))
    assert torch.equal(first_argmax(x[0]), x[0].argmax(-1, keepdim=True))


@settings(max_examples=100, deadline=None)
@given(logits())
def test_counts_are_torchs_sums(x: torch.Tensor) -> None:
    assert torch.equal(kept_count(x).long(), (x != -math.inf).sum(-1))
    assert torch.equal(count_true(x > 1).long(), (x > 1).sum(-1))
    finite = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0)
    assert torch.equal(kept_count(finite).long(), torch.full((x.shape[0],), x.shape[1]))
