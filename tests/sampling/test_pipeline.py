"""The sampling pipeline: hand-computed vectors, the article's routine as an oracle,
properties, and determinism."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.filters import apply_penalties, keep_min_p, keep_top_k, keep_top_p
from llmsample.sampling.history import NO_HISTORY, TokenHistory
from llmsample.sampling.pipeline import draw, entropy_bits, make_generator, sampler_chain, sampling_probs

PROBS = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
LOGITS = PROBS.log()


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits[0]).nonzero().flatten().tolist())


# --- hand-computed vectors -------------------------------------------------------------------


def test_top_p_boundary_keeps_the_crossing_token() -> None:
    assert kept(keep_top_p(LOGITS, 0.7)) == {3, 2}  # .4 + .3 reaches .7 exactly
    assert kept(keep_top_p(LOGITS, 0.8)) == {3, 2, 1}
    assert kept(keep_top_p(LOGITS, 0.69)) == {3, 2}
    assert kept(keep_top_p(LOGITS, 0.4)) == {3}
    assert kept(keep_top_p(LOGITS, 0.41)) == {3, 2}
    assert kept(keep_top_p(LOGITS, 1e-9)) == {3}  # always at least one
    assert kept(keep_top_p(LOGITS, 1.0)) == {0, 1, 2, 3}


def test_top_p_keeps_what_exact_arithmetic_keeps() -> None:
    # .4999995 has not reached .5, so .3 crosses it and stays (transformers keeps it too);
    # an absolute 1e-6 margin dropped it.
    logits = torch.tensor([[0.4999995, 0.3, 0.2000005]]).log()
    assert kept(keep_top_p(logits, 0.5)) == {0, 1}
    assert kept(keep_top_p(logits, 0.4999995)) == {0}


def test_prefixes_of_no_drafted_tokens_is_the_history_itself() -> None:
    history = TokenHistory.start(torch.tensor([[1, 2]]), 5).advanced(torch.tensor([3]))
    none = history.prefixes(torch.zeros(0, dtype=torch.long))
    assert none.counts.shape == (1, 5)
    assert torch.equal(none.counts, history.counts) and torch.equal(none.seen, history.seen)
    two = history.prefixes(torch.tensor([4, 4]))
    assert two.counts[:, 4].tolist() == [0, 1, 2]
    assert two.seen[:, 4].tolist() == [False, True, True]


def test_an_overflowing_penalty_keeps_the_distribution_finite() -> None:
    # 5 / 1e-40 is +inf in float32: the seen token must win outright, not turn into NaN.
    logits = torch.tensor([[5.0, 1.0, -1.0]])
    history = TokenHistory.start(torch.tensor([[0, 2]]), 3)
    probs = sampling_probs(logits, history, SamplingConfig(repetition_penalty=1e-40))
    assert probs.tolist() == [[1.0, 0.0, 0.0]]
    # Every token seen and negative, a huge penalty: all equally unlikely, still a distribution.
    everything = TokenHistory.start(torch.tensor([[0, 1, 2]]), 3)
    probs = sampling_probs(-logits.abs(), everything, SamplingConfig(repetition_penalty=1e38))
    assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0)
    # A removed token (-inf from the model) stays removed.
    probs = sampling_probs(torch.tensor([[-torch.inf, 1e30, 0.0]]), NO_HISTORY, SamplingConfig(temperature=2e-4))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_top_k() -> None:
    assert kept(keep_top_k(LOGITS, 0)) == {0, 1, 2, 3}
    assert kept(keep_top_k(LOGITS, 4)) == {0, 1, 2, 3}
    assert kept(keep_top_k(LOGITS, 9)) == {0, 1, 2, 3}
    assert kept(keep_top_k(LOGITS, 2)) == {2, 3}
    ties = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]])
    assert kept(keep_top_k(ties, 2)) == {1, 2}  # ties broken towards the lower id
    assert kept(keep_top_k(ties, 1)) == {1}


def test_min_p_on_both_sides_of_each_threshold() -> None:
    # thresholds relative to p_max = .4: .1 -> .25, .2 -> .5, .3 -> .75
    assert kept(keep_min_p(LOGITS, 0.24)) == {0, 1, 2, 3}
    assert kept(keep_min_p(LOGITS, 0.26)) == {1, 2, 3}
    assert kept(keep_min_p(LOGITS, 0.49)) == {1, 2, 3}
    assert kept(keep_min_p(LOGITS, 0.51)) == {2, 3}
    assert kept(keep_min_p(LOGITS, 0.74)) == {2, 3}
    assert kept(keep_min_p(LOGITS, 0.76)) == {3}
    assert kept(keep_min_p(LOGITS, 1.0)) == {3}
    assert kept(keep_min_p(LOGITS, 0.0)) == {0, 1, 2, 3}


def test_repetition_penalty_pushes_both_signs_down() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    history = TokenHistory.start(torch.tensor([[0, 1]]), 3)
    out = apply_penalties(logits, history, SamplingConfig(repetition_penalty=2.0))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_frequency_and_presence_penalties_follow_openai() -> None:
    logits = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    history = TokenHistory.start(torch.tensor([[3]]), 4)  # prompt tokens do not count
    for token in (0, 0, 0, 1):
        history = history.advanced(torch.tensor([token]))
    out = apply_penalties(logits, history, SamplingConfig(frequency_penalty=0.5, presence_penalty=0.25))
    # logit -= count * 0.5 + (count > 0) * 0.25 with counts [3, 1, 0, 0]
    assert out.tolist() == [[1.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25, 1.0, 1.0]]


def test_stages_never_modify_their_input() -> None:
    logits = torch.randn(2, 50)
    before = logits.clone()
    history = TokenHistory.start(torch.tensor([[1, 2], [3, 4]]), 50).advanced(torch.tensor([5, 6]))
    cfg = SamplingConfig(
        temperature=0.7,
        top_k=10,
        top_p=0.8,
        min_p=0.05,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.5,
    )
    for function in (
        lambda x: keep_top_k(x, 3),
        lambda x: keep_top_p(x, 0.5),
        lambda x: keep_min_p(x, 0.3),
        lambda x: apply_penalties(x, history, cfg),
        lambda x: sampling_probs(x, history, cfg),
    ):
        function(logits)
        assert torch.equal(logits, before)


def test_greedy_is_one_hot_argmax() -> None:
    probs = sampling_probs(LOGITS, NO_HISTORY, SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 0.0, 0.0, 1.0]]
    probs = sampling_probs(LOGITS, NO_HISTORY, SamplingConfig(temperature=1e-4))
    assert probs.tolist() == [[0.0, 0.0, 0.0, 1.0]]


def test_entropy_bits() -> None:
    assert entropy_bits(torch.tensor([[0.5, 0.5, 0.0]])).item() == pytest.approx(1.0)
    assert entropy_bits(torch.tensor([[0.25] * 4])).item() == pytest.approx(2.0)
    assert entropy_bits(torch.tensor([[1.0, 0.0]])).item() == 0.0


# --- the article's routine (section 6) as an oracle --------------------------------------------


def article_distribution(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The article's sample_next_token, written independently, returning the distribution it
    draws from instead of a draw."""
    if temperature <= 1e-4:
        return F.one_hot(torch.argmax(logits), logits.shape[-1]).float()
    scaled = logits / temperature
    if top_k > 0:
        remove = scaled < torch.topk(scaled, top_k)[0][..., -1, None]
        scaled[remove] = -float("inf")
    if 0.0 < top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scaled, descending=True)
        cumulative = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
        remove_sorted = cumulative > top_p
        remove_sorted[..., 1:] = remove_sorted[..., :-1].clone()
        remove_sorted[..., 0] = False
        scaled[sorted_indices[remove_sorted]] = -float("inf")
    return F.softmax(scaled, dim=-1)


@pytest.mark.parametrize("seed", range(25))
def test_pipeline_matches_the_article(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(200, generator=g) * 3
    temperature = [0.0, 0.3, 0.7, 1.0, 1.5][seed % 5]
    top_k = [0, 1, 5, 50, 200][seed // 5 % 5]
    top_p = [1.0, 0.9, 0.5, 0.95, 0.1][(seed * 3) % 5]
    expected = article_distribution(logits.clone(), temperature, top_k, top_p)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    ours = sampling_probs(logits[None], NO_HISTORY, cfg)[0]
    assert set((ours > 0).nonzero().flatten().tolist()) == set((expected > 0).nonzero().flatten().tolist())
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)


# --- properties ---------------------------------------------------------------------------------

logit_rows = st.lists(
    st.floats(min_value=-30, max_value=30, allow_nan=False, allow_infinity=False, width=32), min_size=2, max_size=40
)
configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 0.05, 0.5, 1.0, 2.0, 10.0]),
    top_k=st.integers(0, 45),
    top_p=st.floats(min_value=0.01, max_value=1.0),
    min_p=st.floats(min_value=0.0, max_value=1.0),
)


@settings(max_examples=200, deadline=None)
@given(logit_rows, configs, st.integers(0, 2**32))
def test_a_filtered_token_is_never_drawn(row: list[float], cfg: SamplingConfig, seed: int) -> None:
    logits = torch.tensor([row])
    probs = sampling_probs(logits, NO_HISTORY, cfg)
    assert not torch.isnan(probs).any()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    allowed = torch.isfinite(sampler_chain(logits, NO_HISTORY, cfg).final)
    tokens = torch.multinomial(probs.expand(64, -1), 1, replacement=True, generator=make_generator(seed)).flatten()
    assert allowed[0, tokens].all()


extreme_rows = st.lists(
    st.one_of(st.sampled_from([1e30, -1e30, 3.4e38, -3.4e38, 0.0]), st.floats(-1e30, 1e30)),
    min_size=2,
    max_size=24,
)
extreme_configs = st.builds(
    SamplingConfig,
    temperature=st.sampled_from([0.0, 1.0001e-4, 1e-3, 0.7, 1.0, 1e4]),
    top_k=st.integers(0, 30),
    top_p=st.sampled_from([1e-9, 0.5, 0.95, 1.0]),
    min_p=st.sampled_from([0.0, 0.05, 1.0]),
    repetition_penalty=st.sampled_from([1e-40, 1e-3, 1.0, 1e3, 1e38]),
    frequency_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
    presence_penalty=st.sampled_from([-2.0, 0.0, 2.0]),
)


@settings(max_examples=300, deadline=None)
@given(extreme_rows, extreme_configs, st.data())
def test_the_pipeline_never_emits_a_non_finite_number(row: list[float], cfg: SamplingConfig, data) -> None:
    logits = torch.tensor([row])
    seen = data.draw(st.lists(st.integers(0, len(row) - 1), min_size=1, max_size=8))
    history = TokenHistory.start(torch.tensor([seen]), len(row)).advanced(torch.tensor([seen[-1]]))
    chain = sampler_chain(logits, history, cfg)
    for stage in chain.stages:
        assert not torch.isnan(stage.logits).any() and not (stage.logits == torch.inf).any()
    probs = chain.probs
    assert torch.isfinite(probs).all()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert probs[0, draw(probs, make_generator(0))].item() > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=2, max_size=30), st.sampled_from([0.3, 1.0, 2.0]))
def test_top_k_one_equals_greedy_ties_included(row: list[int], temperature: float) -> None:
    logits = torch.tensor([row], dtype=torch.float32)  # small integers: many ties
    greedy = sampling_probs(logits, NO_HISTORY, SamplingConfig(temperature=0.0))
    top1 = sampling_probs(logits, NO_HISTORY, SamplingConfig(temperature=temperature, top_k=1))
    assert torch.equal(greedy, top1)


def test_same_seed_same_draws() -> None:
    probs = sampling_probs(
        torch.randn(1, 1000, generator=torch.Generator().manual_seed(1)), NO_HISTORY, SamplingConfig()
    )
    runs = {tuple(draw(probs.expand(16, -1), make_generator(42)).tolist()) for _ in range(20)}
    assert len(runs) == 1
    assert len(set(next(iter(runs)))) > 1  # the draws do vary within a run


@settings(max_examples=100, deadline=None)
@given(
    st.lists(logit_rows.filter(lambda r: len(r) >= 8).map(lambda r: r[:8]), min_size=1, max_size=6), configs, st.data()
)
def test_per_row_generators_draw_what_each_row_draws_alone(rows: list[list[float]], cfg, data) -> None:
    """A batch drawn with one generator per row (the batch and multi-sample loops) equals each
    row drawn alone from a fresh generator with the same seed."""
    seeds = data.draw(st.lists(st.integers(0, 2**32), min_size=len(rows), max_size=len(rows)))
    chain = sampler_chain(torch.tensor(rows), NO_HISTORY, cfg)
    together = chain.draw([make_generator(seed) for seed in seeds])
    alone = [draw(chain.probs[i : i + 1], make_generator(seed)).item() for i, seed in enumerate(seeds)]
    assert together.tolist() == alone


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=2, max_size=30))
def test_a_greedy_chain_reads_off_what_a_draw_would_pick(row: list[int]) -> None:
    """Greedy skips the cumulative sum: its one surviving token is the one every draw returns."""
    chain = sampler_chain(torch.tensor([row], dtype=torch.float32), NO_HISTORY, SamplingConfig(temperature=0.0))
    assert chain.draw(make_generator(0)).tolist() == draw(chain.probs, make_generator(0)).tolist()
    assert chain.draw(None).item() == row.index(max(row))
