"""The block-maxima rankings give torch's answers: ``topk``'s values (ties, -inf, +inf and NaN
included) with ids that hold them, a row's answer the same alone and beside others, and the
counts above a value that a full pass gives, on the fast path and on its fallbacks."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import blocks
from llmsample.sampling.blocks import count_above, count_true, top
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain

SPECIAL = (-math.inf, math.inf, math.nan)


@st.composite
def wide_logits(draw: st.DrawFn) -> torch.Tensor:
    """Rows wide enough for blocks to pay, of few distinct values (ties everywhere) or of spread
    ones, with specials dropped in; one width that does not split into blocks."""
    rows = draw(st.integers(1, 4))
    vocab = draw(st.sampled_from([4096, 8192, 4160, 4100]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        x = torch.randint(0, draw(st.integers(1, 6)), (rows, vocab), generator=generator).float()
    else:
        x = torch.randn(rows, vocab, generator=generator) * 4
    for _ in range(draw(st.integers(0, 6))):
        x[draw(st.integers(0, rows - 1)), draw(st.integers(0, vocab - 1))] = draw(st.sampled_from(SPECIAL))
    if draw(st.booleans()):
        x[draw(st.integers(0, rows - 1)), : vocab // 2] = -math.inf  # half a row removed
    return x


@settings(max_examples=300, deadline=None)
@given(wide_logits(), st.integers(1, 8))
def test_top_is_torchs_topk(x: torch.Tensor, m: int) -> None:
    values, ids = top(x, m)
    expected = x.topk(m, dim=-1).values
    torch.testing.assert_close(values, expected, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x.gather(-1, ids), values, rtol=0, atol=0, equal_nan=True)
    assert all(len(set(row)) == m for row in ids.tolist())  # m distinct tokens a row
    if blocks.blocks_pay(x, m):  # with the maxima a caller hands over
        assert torch.equal(top(x, m, blocks.block_maxima(x))[1], ids)
    for i in range(x.shape[0]):  # alone as beside the others
        _, alone_ids = top(x[i : i + 1], m)
        assert torch.equal(alone_ids, ids[i : i + 1])


@settings(max_examples=300, deadline=None)
@given(wide_logits(), st.integers(0, 4095), st.booleans())
def test_count_above_is_a_full_count(x: torch.Tensor, at: int, ranked: bool) -> None:
    """At a likely token's value (few blocks above: the fast path) and at any token's (many)."""
    if ranked:  # the value of a token among the top few
        column = x.nan_to_num(nan=-math.inf).topk(1 + at % 4, dim=-1).indices[:, -1:]
    else:
        column = torch.full((x.shape[0], 1), at)
    value = x.gather(-1, column)
    assert torch.equal(count_above(x, value), count_true(x > value))
    if blocks.blocks_pay(x, 1):  # the maxima the figures hand over
        assert torch.equal(count_above(x, value, blocks.block_maxima(x)), count_true(x > value))


def test_blocks_are_used_where_they_pay() -> None:
    """The property tests above cover the fast path: it is the one these widths take."""
    assert blocks.blocks_pay(torch.zeros(2, 4096), 8) and not blocks.blocks_pay(torch.zeros(2, 4100), 1)
    assert not blocks.blocks_pay(torch.zeros(2, 4096), 9)


SETTINGS = [
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.booleans(), st.sampled_from(SETTINGS), st.sampled_from([None, math.inf, math.nan]))
def test_the_figures_of_a_wide_row_rank_as_torch_does(
    seed: int, tied: bool, cfg: SamplingConfig, broken: float | None
) -> None:
    """At 4096 tokens the figures' top list, rank and range come from the row's block maxima; a
    row with +inf or NaN is told as broken (the last row, here)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (3, 4096)
    x = torch.randint(0, 6, shape, generator=generator).float() if tied else torch.randn(shape, generator=generator) * 4
    if broken is not None:
        x[-1, seed % 4096] = broken
    assert blocks.blocks_pay(x, 5)
    chain = sampler_chain(x, TokenHistory(None, None), cfg)
    for r, figure in enumerate(step_figures(chain, chain.draw(make_generator(seed)), 5)):
        assert figure.finite_logits == (broken is None or r < 2)
        if figure.finite_logits:
            assert figure.model_rank == int((x[r] > x[r, figure.token_id]).sum()) + 1
            assert x[r, figure.top_ids].tolist() == x[r].topk(5).values.tolist()
