"""The lean step's shortcuts give the long way's answers: the drawn token's rank read off the
raw top list, and the temperature computed on top-k's candidates."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import blocks
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import count_above
from llmsample.sampling.filters import apply_temperature, keep_top_k
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import sampler_chain

INERT = TokenHistory(None, None)


@st.composite
def rows(draw: st.DrawFn) -> torch.Tensor:
    """Rows of spread values or of few distinct ones (ties at every place), specials dropped in."""
    batch, vocab = draw(st.integers(1, 3)), 4096
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        x = torch.randn(batch, vocab, generator=generator) * 4
    else:
        x = torch.randint(0, draw(st.integers(1, 6)), (batch, vocab), generator=generator).float()
    for _ in range(draw(st.integers(0, 4))):
        x[draw(st.integers(0, batch - 1)), draw(st.integers(0, vocab - 1))] = draw(
            st.sampled_from([-math.inf, math.inf, math.nan])
        )
    return x


@settings(max_examples=300, deadline=None)
@given(rows(), st.integers(1, 5), st.integers(0, 4095), st.booleans())
def test_the_rank_from_the_top_list_is_a_full_count(x: torch.Tensor, m: int, at: int, ranked: bool) -> None:
    """At a token inside the top list (the shortcut) and at any token (the blocks' fallback)."""
    top = blocks.top(x, m)[0]
    column = blocks.top(x, 1 + at % m)[1][:, -1:] if ranked else torch.full((x.shape[0], 1), at)
    value = x.gather(-1, column)
    assert torch.equal(count_above(x, value, blocks.block_maxima(x), top), blocks.count_true(x > value))


@settings(max_examples=100, deadline=None)
@given(rows(), st.sampled_from([0.3, 0.8, 1.5]), st.sampled_from([1, 5, 40]))
def test_the_temperature_on_candidates_is_the_rows(x: torch.Tensor, temperature: float, k: int) -> None:
    """Its candidates are top-k's after it, its values the whole row's; the stage's row, when read, is the
    whole row's stage."""
    cfg = SamplingConfig(temperature=temperature, top_k=k)
    chain = sampler_chain(x, INERT, cfg)
    stage = chain.stages[chain.names.index("temperature")]
    whole = apply_temperature(x, temperature)
    assert torch.equal(stage.logits.nan_to_num(), whole.nan_to_num())
    kept = chain.stages[chain.names.index("top_k")].logits  # ties at the k-th place: the lower ids
    assert torch.equal(kept.nan_to_num(), keep_top_k(whole, k).nan_to_num())
    if stage.ids is not None:
        assert torch.equal(stage.values, whole.gather(-1, stage.ids))
        assert torch.equal(stage.ids, chain.stages[chain.names.index("top_k")].ids)


def test_a_smooth_row_takes_the_candidates() -> None:
    x = torch.randn(2, 4096, generator=torch.Generator().manual_seed(0))
    chain = sampler_chain(x, INERT, SamplingConfig(temperature=0.8, top_k=40))
    stage = chain.stages[chain.names.index("temperature")]
    assert stage.ids is not None and stage.values.shape == (2, 40)
