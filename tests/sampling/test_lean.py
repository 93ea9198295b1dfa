"""The lean step's shortcuts give the long way's answers: the drawn token's rank read off the
raw top list, the temperature computed on top-k's candidates, the figures read on the host, the
figures' top list taken from the chain's ranking, and top-p's ranking of a few candidates."""

from __future__ import annotations

import math
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import blocks, filters, text_stages
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import WatchIndex, count_above, step_figures
from llmsample.sampling.filters import apply_temperature, keep_top_k, keep_top_p
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import Stage, sampler_chain
from llmsample.sampling.stages import FILTER_STAGES
from tests.sampling.test_samplers import TOKENIZER

INERT = TokenHistory(None, None)


@st.composite
def rows(draw: st.DrawFn) -> torch.Tensor:
    """Rows of spread values or of few distinct ones (ties at every place), specials dropped in (a
    logit near float32's limit overflows at a temperature below 1), or most of the row removed."""
    batch, vocab = draw(st.integers(1, 3)), 4096
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        x = torch.randn(batch, vocab, generator=generator) * 4
    else:
        x = torch.randint(0, draw(st.integers(1, 6)), (batch, vocab), generator=generator).float()
    for _ in range(draw(st.integers(0, 4))):
        x[draw(st.integers(0, batch - 1)), draw(st.integers(0, vocab - 1))] = draw(
            st.sampled_from([-math.inf, math.inf, math.nan, 3e38, -3e38])
        )
    if draw(st.booleans()):  # fewer tokens left than top-k keeps (a grammar's mask)
        x[:, draw(st.integers(0, 60)) :] = -math.inf
    return x


@settings(max_examples=300, deadline=None)
@given(rows(), st.integers(1, 5), st.integers(0, 4095), st.booleans())
def test_the_rank_from_the_top_list_is_a_full_count(x: torch.Tensor, m: int, at: int, ranked: bool) -> None:
    """At a token inside the top list (the shortcut) and at any token (the blocks' fallback)."""
    top = blocks.top(x, m)[0]
    column = blocks.top(x, 1 + at % m)[1][:, -1:] if ranked else torch.full((x.shape[0], 1), at)
    value = x.gather(-1, column)
    counted = torch.as_tensor(count_above(x, value, blocks.block_maxima(x), top), dtype=torch.int32)
    assert torch.equal(counted, blocks.count_true(x > value))


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


CONFIGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingConfig(temperature=0.7, top_k=5, top_p=0.9),
    SamplingConfig(temperature=1.0, top_p=0.5),
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplingConfig(temperature=1.3, top_k=3, min_p=0.2, repetition_penalty=1.3),
]


@settings(max_examples=150, deadline=None)
@given(rows(), st.sampled_from(CONFIGS), st.sampled_from([0, 1, 5]), st.booleans(), st.booleans())
def test_the_figures_read_on_the_host_are_the_one_transfers(
    x: torch.Tensor, cfg: SamplingConfig, top_n: int, watched: bool, drafted: bool
) -> None:
    """A CPU's figures (the sampled probabilities looked up among the candidates, the rank off
    the top list, the counts and the maximum read per column) are exactly the figures of the one
    transfer an accelerator makes of the same columns, broken rows included."""
    counts = torch.ones(x.shape[0], 1)
    history = TokenHistory(counts, counts.expand_as(x) > 0) if cfg.has_penalties else INERT
    chain = sampler_chain(x, history, cfg)
    tokens = chain.draw([torch.Generator().manual_seed(r) for r in range(x.shape[0])])
    watch = WatchIndex.of([0, 9, 4095], x.device) if watched else None
    accepted = torch.arange(x.shape[0]) if drafted else None
    host = step_figures(chain, tokens, top_n, watch, accepted)
    with mock.patch.object(filters, "host_syncs_are_free", lambda tensor: False):
        one = step_figures(chain, tokens, top_n, watch, accepted)
    assert [repr(f) for f in host] == [repr(f) for f in one]
    for r, figure in enumerate(host):  # a filter's count is its row's tokens left; another stage keeps its input's
        kept: list[int] = []
        for stage in chain.stages:
            left = int((~stage.logits[r].isneginf()).sum())
            kept.append(left if not kept or stage.name in FILTER_STAGES else kept[-1])
        removed = {name: kept[i - 1] - kept[i] for i, name in enumerate(chain.names) if name in FILTER_STAGES}
        assert (figure.candidates, figure.removed) == (kept[-1], removed)


@settings(max_examples=200, deadline=None)
@given(rows(), st.integers(1, 256), st.sampled_from([0.0, 0.3, 0.9, 0.999]))
def test_top_p_ranks_a_few_candidates_as_it_ranks_a_wide_row(x: torch.Tensor, width: int, p: float) -> None:
    """At most 256 candidates (a chain's, after top-k) are ranked by one stable sort; a row wider
    than that by ``topk`` and its widening. Padded with removed tokens, the row keeps the same."""
    few = x[:, :width] / 2
    padded = torch.cat([few, torch.full((x.shape[0], 300), -math.inf)], -1)
    assert torch.equal(keep_top_p(few, p).nan_to_num(), keep_top_p(padded, p)[:, :width].nan_to_num())


def _ranked_alone(stage: Stage, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each asker's own ranking of exactly ``m`` (the step before the chain shared its top-k's)."""
    return blocks.top(stage.values, m, stage.maxima if blocks.blocks_pay(stage.values, m) else None)


@settings(max_examples=150, deadline=None)
@given(rows(), st.sampled_from([*CONFIGS, SamplingConfig(temperature=0.7, top_k=4)]), st.sampled_from([1, 5, 12]))
def test_the_figures_from_the_chains_ranking_are_their_own(x: torch.Tensor, cfg: SamplingConfig, top_n: int) -> None:
    """The top list and the drawn token's rank taken from the raw row's ranking the chain's top-k
    made (wider or narrower than the list) are the figures of a ranking of their own, to the bit,
    ties included (tied tokens are listed in the ranking of the list's own width)."""
    counts = torch.ones(x.shape[0], 1)
    history = TokenHistory(counts, counts.expand_as(x) > 0) if cfg.has_penalties else INERT
    chain = sampler_chain(x, history, cfg)
    tokens = chain.draw([torch.Generator().manual_seed(r) for r in range(x.shape[0])])
    shared = step_figures(chain, tokens, top_n)
    with mock.patch.object(Stage, "top", _ranked_alone):
        alone = step_figures(sampler_chain(x, history, cfg), tokens, top_n)
    assert [repr(f) for f in shared] == [repr(f) for f in alone]


@settings(max_examples=150, deadline=None)
@given(rows())
def test_greedy_on_the_raw_rows_block_maxima_keeps_argmax(x: torch.Tensor) -> None:
    """Greedy on the raw row searches the block maxima the figures rank (no pass of its own): the
    token it keeps is torch's first argmax, ties and NaN included, as keep_argmax keeps it."""
    chain = sampler_chain(x, INERT, SamplingConfig(temperature=0.0))
    assert chain.support is not None  # it narrowed to the one token
    assert torch.equal(chain.draw(None), x.argmax(-1))
    assert torch.equal(chain.final.nan_to_num(), filters.keep_argmax(x).nan_to_num())


MASKED = [
    SamplingConfig(temperature=0.0, min_tokens=5),
    SamplingConfig(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, min_tokens=5, ban=("Hel",)),
    SamplingConfig(temperature=0.0, no_repeat_ngram_size=2, ban=("Hel",), repetition_penalty=1.3),
    SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, min_tokens=5, no_repeat_ngram_size=1),
]


@settings(max_examples=150, deadline=None)
@given(rows(), st.sampled_from(MASKED), st.sampled_from([0, 1, 5]))
def test_a_masks_counts_and_maxima_mended_at_its_tokens_are_the_whole_rows(
    x: torch.Tensor, cfg: SamplingConfig, top_n: int
) -> None:
    """A mask stage (ban, min-tokens, no-repeat-ngram) sets a few tokens to -inf: its kept count
    and block maxima, mended there from the stage before's, are those of its row counted whole,
    and so are the draw and every figure, broken rows (NaN, -inf where it masks) included."""
    prompt = torch.tensor([[1, 2, 1, 2, 4095, 777]]).expand(x.shape[0], -1)  # n-grams to repeat; EOS ids
    history = TokenHistory.for_config(prompt, x.shape[-1], cfg, TOKENIZER, eos_ids=[0, 777, 4095])
    chain = sampler_chain(x, history, cfg)
    assert any(stage.masking is not None for stage in chain.stages)
    tokens = chain.draw([torch.Generator().manual_seed(r) for r in range(x.shape[0])])
    if cfg.is_greedy:  # greedy on the masked (and penalised) row's mended maxima keeps its first argmax
        assert torch.equal(tokens, chain.penalised.logits.argmax(-1))
    mended = step_figures(chain, tokens, top_n)
    with mock.patch.dict(text_stages.MASKS, clear=True):  # each mask as its stage function: no Masking
        whole = sampler_chain(x, history, cfg)
    assert not any(stage.masking is not None for stage in whole.stages)
    assert torch.equal(whole.draw([torch.Generator().manual_seed(r) for r in range(x.shape[0])]), tokens)
    assert [repr(f) for f in mended] == [repr(f) for f in step_figures(whole, tokens, top_n)]
    for stage in chain.stages:
        if stage.masking is not None:
            torch.testing.assert_close(stage.maxima, blocks.block_maxima(stage.values), rtol=0, atol=0, equal_nan=True)


def test_top_p_on_no_rows_keeps_their_shape() -> None:
    for width in (40, 4096):  # a chain's few candidates (ranked on the host), a wide row
        assert keep_top_p(torch.zeros(0, width), 0.5).shape == (0, width)
