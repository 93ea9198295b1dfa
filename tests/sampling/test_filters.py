"""The reductions the chain and the step figures run over every row: the same answers as torch's
plain ones, ties, NaN and infinities included; and the filters that take one setting per row give
each row what it gets alone."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llmsample.sampling import blocks
from llmsample.sampling.filters import (
    apply_temperature,
    count_true,
    first_argmax,
    keep_finite,
    keep_min_p,
    keep_top_p,
    kept_count,
)

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


@settings(max_examples=200, deadline=None)
@given(logits())
def test_first_argmax_from_the_rows_block_maxima_is_torchs_argmax(x: torch.Tensor) -> None:
    """Greedy on the raw row searches the block maxima the figures rank: the same first index."""
    assume(x.shape[-1] % blocks.BLOCK == 0)
    assert torch.equal(first_argmax(x, blocks.block_maxima(x)), x.argmax(-1, keepdim=True))


@settings(max_examples=100, deadline=None)
@given(logits())
def test_counts_are_torchs_sums(x: torch.Tensor) -> None:
    assert torch.equal(kept_count(x).long(), (x != -math.inf).sum(-1))
    assert torch.equal(count_true(x > 1).long(), (x > 1).sum(-1))
    finite = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=0.0)
    assert torch.equal(kept_count(finite).long(), torch.full((x.shape[0],), x.shape[1]))


@settings(max_examples=200, deadline=None)
@given(logits(), st.sampled_from([0.05, 0.5, 0.8, 1.0, 1.7, 1e-30]), st.sampled_from([1.0, 1e20, 1e37]))
def test_the_temperature_clamps_only_what_overflows(x: torch.Tensor, temperature: float, scale: float) -> None:
    x = x * scale  # logits of 1e37 overflow at a temperature below 1
    expected = keep_finite(x / temperature, x) if temperature != 1.0 else x
    assert _same_nan(apply_temperature(x, temperature), expected)


def _same_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a[~a.isnan()], b[~b.isnan()])


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**31),
    st.lists(st.tuples(st.sampled_from([0.3, 0.8, 1.0, 1.9]), st.sampled_from([0.2, 0.9, 0.999, 1.0]),
                       st.sampled_from([0.0, 0.02, 0.3])), min_size=1, max_size=5),
)  # fmt: skip
def test_per_row_settings_give_each_row_its_own_result(seed: int, settings_: list[tuple[float, float, float]]) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(len(settings_), 3000, generator=generator) * 4
    x[0, :5] = -math.inf  # a row that a stage before had already narrowed
    temperature, top_p, min_p = (
        torch.tensor(column, dtype=torch.float64).view(-1, 1) for column in zip(*settings_, strict=True)
    )
    for together, alone in (
        (apply_temperature(x, temperature.float()), lambda row, t, p, m: apply_temperature(row, t)),
        (keep_top_p(x, top_p), lambda row, t, p, m: keep_top_p(row, p)),
        (keep_min_p(x, min_p), lambda row, t, p, m: keep_min_p(row, m)),
    ):
        for i, (t, p, m) in enumerate(settings_):
            assert torch.equal(together[i : i + 1], alone(x[i : i + 1], t, p, m)), (i, t, p, m)


@pytest.mark.parametrize("neighbour", ["same settings", "own settings"])
def test_a_rows_top_p_does_not_depend_on_its_neighbours_under_ties(neighbour: str) -> None:
    """bf16 logits tie often; a flat neighbour widens the nucleus search (``topk`` of another width,
    which orders ties its own way): the row still keeps the same tokens."""
    from llmsample.sampling.config import SamplingConfig
    from llmsample.sampling.history import NO_HISTORY
    from llmsample.sampling.pipeline import sampler_chain
    from llmsample.sampling.row_values import RowValues

    generator = torch.Generator().manual_seed(2)
    mine = SamplingConfig(temperature=0.8, top_p=0.9)
    theirs = mine if neighbour == "same settings" else SamplingConfig(temperature=1.0, top_p=0.8)
    values = RowValues.of([mine, theirs], torch.device("cpu"))
    for _ in range(8):
        row = torch.randn(1, 49152, generator=generator) * 2
        row[0, :20] += 6
        flat = torch.randn(1, 49152, generator=generator) * 0.5
        row, flat = row.bfloat16().float(), flat.bfloat16().float()
        alone = sampler_chain(row, NO_HISTORY, mine)
        together = sampler_chain(torch.cat([row, flat]), NO_HISTORY, mine, values)
        for a, b in zip(alone.stages, together.stages, strict=True):
            assert torch.equal(a.logits[0], b.logits[0]), a.name
