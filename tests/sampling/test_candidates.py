"""Top-k's candidates: the chain after top-k runs on the k tokens it kept, and gives what the
whole-row chain gives: the same stages, the same distribution, the same draws, the same figures."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling import pipeline
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import WatchIndex, step_figures
from llmsample.sampling.filters import keep_min_p, keep_top_k, kept_candidates, top_k_candidates
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain

VOCAB = 1024
INERT = TokenHistory(None, None)


@st.composite
def logits(draw: st.DrawFn) -> torch.Tensor:
    """Rows of smooth logits, or of few distinct values (ties at the k-th place), some with -inf
    (fewer finite tokens than k)."""
    rows = draw(st.integers(1, 4))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if draw(st.booleans()):
        x = torch.randn(rows, VOCAB, generator=generator) * draw(st.sampled_from([0.5, 2.0, 6.0]))
    else:
        x = torch.randint(0, draw(st.integers(2, 6)), (rows, VOCAB), generator=generator).float()
    if draw(st.booleans()):
        row = draw(st.integers(0, rows - 1))
        x[row, draw(st.integers(0, VOCAB)) :] = -math.inf  # from 0: a row with nothing left
    return x


def configs() -> st.SearchStrategy[SamplingConfig]:
    return st.builds(
        SamplingConfig,
        temperature=st.sampled_from([0.0, 0.3, 0.8, 1.0, 1.5]),
        top_k=st.sampled_from([0, 1, 5, 40, 128]),
        top_p=st.sampled_from([0.5, 0.9, 1.0]),
        top_n_sigma=st.sampled_from([0.0, 1.0]),
        min_p=st.sampled_from([0.0, 0.05, 0.2]),
        typical_p=st.sampled_from([1.0, 0.9]),
        xtc_probability=st.sampled_from([0.0, 0.5]),
        xtc_threshold=st.just(0.1),
    )


def whole_row_chain(x: torch.Tensor, cfg: SamplingConfig) -> pipeline.Chain:
    with mock.patch.object(pipeline, "compacts", lambda logits, k: False):
        return sampler_chain(x, INERT, cfg)


def kept_values(stage: torch.Tensor) -> torch.Tensor:
    """Each row's kept logits, sorted (the same whichever of several tied tokens were kept)."""
    return torch.where(stage > -math.inf, stage, math.inf).sort(-1).values


def distinct(x: torch.Tensor) -> bool:
    return all(len(set(row.tolist())) == len(row) for row in x)


@settings(max_examples=200, deadline=None)
@given(logits(), st.sampled_from([1, 3, 40, 128]))
def test_the_candidates_are_the_tokens_top_k_keeps(x: torch.Tensor, k: int) -> None:
    values, ids = top_k_candidates(x, k)
    kept = keep_top_k(x, k)
    assert ids.shape[0] == x.shape[0] and ids.shape[1] <= k and torch.equal(ids, ids.sort(-1).values)
    assert torch.equal(values, x.gather(-1, ids))
    finite = kept > -math.inf
    assert torch.equal(torch.zeros_like(finite).scatter(-1, ids, values > -math.inf), finite)


@settings(max_examples=200, deadline=None)
@given(logits())
def test_the_candidates_of_a_filter_are_every_token_it_kept(x: torch.Tensor) -> None:
    kept = keep_min_p(x, 0.3)
    narrowed = kept_candidates(kept, VOCAB)
    assert narrowed is not None
    values, ids = narrowed
    width = int((kept > -math.inf).sum(-1).max())
    assert ids.shape == (x.shape[0], max(width, 1)) and torch.equal(ids, ids.sort(-1).values)
    assert torch.equal(values, kept.gather(-1, ids))
    finite = kept > -math.inf
    assert torch.equal(torch.zeros_like(finite).scatter(-1, ids, values > -math.inf), finite)
    assert kept_candidates(kept, width - 1) is None


@settings(max_examples=300, deadline=None)
@given(logits(), configs(), st.integers(0, 2**31))
def test_the_chain_on_candidates_is_the_chain_on_the_whole_row(x: torch.Tensor, cfg: SamplingConfig, seed: int) -> None:
    compact, whole = sampler_chain(x, INERT, cfg), whole_row_chain(x, cfg)
    assert whole.support is None
    if 0 < cfg.top_k <= VOCAB // 8:
        assert compact.support is not None
    assert compact.names == whole.names
    for ours, theirs in zip(compact.stages, whole.stages, strict=True):
        # Which of several tied tokens top-p keeps is the sort's (torch's topk) on either path;
        # how many, and their values, are not.
        assert torch.equal(kept_values(ours.logits), kept_values(theirs.logits)), ours.name
        if distinct(x):
            assert torch.equal(ours.logits, theirs.logits), ours.name
    if distinct(x):
        assert torch.allclose(compact.probs, whole.probs, atol=1e-6)
    # The same uniform walks the same candidates in the same order: the same token.
    rows = x.shape[0]
    drawn = compact.draw([make_generator(seed + r) for r in range(rows)])
    assert torch.equal(drawn, pipeline.draw(compact.probs, [make_generator(seed + r) for r in range(rows)]))
    if distinct(x):
        assert torch.equal(drawn, whole.draw([make_generator(seed + r) for r in range(rows)]))
    for part in (slice(0, 1), slice(1, rows)) if rows > 1 else (slice(0, 1),):
        gens = [make_generator(seed + r) for r in range(rows)][part]
        assert torch.equal(compact.rows(part).draw(gens), drawn[part])


@settings(max_examples=60, deadline=None)
@given(logits(), configs())
def test_the_figures_on_candidates_are_the_figures_on_the_whole_row(x: torch.Tensor, cfg: SamplingConfig) -> None:
    compact, whole = sampler_chain(x, INERT, cfg), whole_row_chain(x, cfg)
    tokens = compact.draw(make_generator(0))
    watch = WatchIndex.of([0, 7, VOCAB - 1], x.device)
    ours, theirs = step_figures(compact, tokens, 5, watch), step_figures(whole, tokens, 5, watch)
    for a, b in zip(ours, theirs, strict=True):
        if not b.finite_logits:  # a row with nothing left: it fails, whatever its figures
            assert not a.finite_logits
            continue
        assert (a.token_id, a.model_rank, a.model_prob, a.removed, a.candidates, a.top_ids) == (
            b.token_id, b.model_rank, b.model_prob, b.removed, b.candidates, b.top_ids,
        )  # fmt: skip
        assert a.entropy == pytest.approx(b.entropy, abs=1e-5) and a.mass == pytest.approx(b.mass, abs=1e-6)
        if distinct(x):  # else a tied token may be kept on one path and its twin on the other
            assert a.prob == pytest.approx(b.prob, abs=1e-6)
            assert a.top_probs == pytest.approx(b.top_probs, abs=1e-6)
            assert [w.prob for w in a.watch] == pytest.approx([w.prob for w in b.watch], abs=1e-6)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("cfg", [SamplingConfig(top_k=40), SamplingConfig(top_p=0.5), SamplingConfig(min_p=0.2)])
def test_a_row_of_nan_or_inf_narrows_without_failing_the_others(bad: float, cfg: SamplingConfig) -> None:
    """A broken row fails later, alone (the step's figures tell it); its neighbours' tokens and
    figures are what they are without it."""
    x = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    x[1, ::7] = bad
    chain = sampler_chain(x, INERT, cfg)
    drawn = chain.draw([make_generator(r) for r in range(3)])
    for r in (0, 2):
        alone = sampler_chain(x[r : r + 1], INERT, cfg)
        assert drawn[r] == alone.draw(make_generator(r))[0]
    figures = step_figures(chain, drawn, 5)
    assert not figures[1].finite_logits and figures[0].finite_logits and figures[2].finite_logits


def test_only_greedy_and_a_small_k_on_a_cpu_hand_on_candidates() -> None:
    x = torch.randn(2, VOCAB)
    assert pipeline.compacts(x, 40) and pipeline.compacts(x, VOCAB // 8)
    assert not pipeline.compacts(x, 0) and not pipeline.compacts(x, VOCAB // 8 + 1)
    greedy = sampler_chain(x, INERT, SamplingConfig(temperature=0.0, top_k=40))
    assert greedy.names[-1] == "greedy" and torch.equal(greedy.support, x.argmax(-1, keepdim=True))
    assert torch.equal(greedy.sampled, torch.ones(2, 1)) and torch.equal(greedy.draw(None), x.argmax(-1))
    narrow, wide = (
        sampler_chain(x * 4, INERT, SamplingConfig(top_p=0.1)),
        sampler_chain(x, INERT, SamplingConfig(top_p=0.999)),
    )
    assert narrow.support is not None and narrow.names[-1] == "min_p" and wide.support is None
