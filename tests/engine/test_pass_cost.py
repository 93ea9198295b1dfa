"""What a pass costs by its width, and the draft length chosen from it (hand-computed rates)."""

from __future__ import annotations

import dataclasses

import pytest

from llmsample.engine.job_row import job_row
from llmsample.engine.pass_cost import BF16_SHAPE, PLAIN_SHAPE, PassShape, best_length, machine_shape
from llmsample.engine.suffix_pool import PRIOR, REACH, SuffixPool, auto_drafter, suffix_drafter
from llmsample.jobs import AUTO, Job
from llmsample.sampling.config import SamplingConfig


def test_a_pass_costs_by_its_width_as_measured_on_each_cpu() -> None:
    # The default model, llama.cpp F16, 2 cores. AVX512-BF16: ~11 ms, ~19, then ~2.3 ms a position.
    assert [BF16_SHAPE.cost(w) for w in (1, 2, 3, 16)] == pytest.approx([1.0, 19 / 11, 21.3 / 11, (19 + 14 * 2.3) / 11])
    # Without BF16: ~22.5 ms, ~27, then ~3.6 ms a position.
    assert [PLAIN_SHAPE.cost(w) for w in (1, 2, 16)] == pytest.approx([1.0, 27 / 22.5, (27 + 14 * 3.6) / 22.5])
    assert machine_shape() in (BF16_SHAPE, PLAIN_SHAPE)


def test_the_length_is_the_one_with_the_most_tokens_for_its_cost() -> None:
    # Costs 1, 1.727, 1.936, 2.145 (one-position passes). One token kept 70 % of the time:
    # 1.7 / 1.727 = 0.984 < 1 — it does not pay.
    assert best_length([0.7], 1, BF16_SHAPE) == 0
    # Where the second position costs 1.2: 1.7 / 1.2 = 1.417 > 1 — it does.
    assert best_length([0.7], 1, PLAIN_SHAPE) == 1
    # .9, .8, .7: 1.9 / 1.727 = 1.10, 2.7 / 1.936 = 1.39, 3.4 / 2.145 = 1.58 — the whole draft.
    assert best_length([0.9, 0.8, 0.7], 1, BF16_SHAPE) == 3
    # 1.95 / 1.727 = 1.129, 2.25 / 1.936 = 1.162, 2.3 / 2.145 = 1.072: two of three.
    assert best_length([0.95, 0.3, 0.05], 1, BF16_SHAPE) == 2
    # Four rows: 4 / 2.145 = 1.864; a fifth position kept half the time 4.5 / 2.355 = 1.911, a
    # third of the time 4.3 / 2.355 = 1.826.
    assert best_length([0.5], 4, BF16_SHAPE) == 1
    assert best_length([0.3], 4, BF16_SHAPE) == 0
    assert best_length([], 1, PLAIN_SHAPE) == 0


def sure_pool(shape: PassShape | None, min_prob: float = REACH) -> SuffixPool:
    """A pool that has seen 0..8 five times, whose sure tokens the target kept 75 % of the time."""
    pool = SuffixPool(2, 3, min_prob=min_prob, shape=shape)
    for _ in range(5):
        pool.extend(pool.open(), [0, 1, 2, 3, 4, 5, 6, 7, 8], 9)
    for _ in range(25):
        pool.scored([1.0, 1.0, 1.0, 1.0], 3)
    return pool


def test_a_pool_that_prices_its_passes_drafts_what_pays() -> None:
    kept = (75 + PRIOR) / (100 + PRIOR)  # .7525: the chance of each token; all of five: .241
    assert kept**5 > REACH > kept**6
    # A floor of 0.6 alone: one token (.7525, then .566).
    assert sure_pool(None, 0.6).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]
    # Priced: 1.7525 / 1.727 = 1.015, 2.319 / 1.936 = 1.198, 2.745 / 2.145 = 1.279,
    # 3.066 / 2.355 = 1.302, 3.307 / 2.564 = 1.290: four tokens.
    assert sure_pool(BF16_SHAPE).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4, 5, 6, 7]
    # Four rows sharing the pass: 4 / 2.145 = 1.864, then 4.7525 / 2.355 = 2.018, 5.319 / 2.564
    # = 2.075, 5.745 / 2.773 = 2.072: two.
    assert sure_pool(BF16_SHAPE).confident([1, 2, 3], [4, 5, 6, 7, 8], rows=4)[0] == [4, 5]


def test_auto_and_suffix_price_their_drafts(tiny_lm) -> None:
    on_llama_cpp = dataclasses.replace(tiny_lm, backend="llama.cpp")
    auto = auto_drafter(on_llama_cpp)
    assert auto is not None and suffix_drafter(on_llama_cpp).pool.shape == auto.pool.shape == machine_shape()


def test_a_job_of_its_own_drafts_from_an_empty_pool(tiny_lm) -> None:
    """A chat exchange (``own_pool``) starts from what a ``generate`` process starts from, whatever
    the engine's pool learned: an undone exchange leaves nothing behind, so the seed's text after
    ``/undo`` is ``generate``'s (tests/commands/test_one_seed.py, on the real model)."""
    auto = auto_drafter(dataclasses.replace(tiny_lm, backend="llama.cpp"))
    assert auto is not None
    auto.pool.extend(auto.pool.open(), [5, 6, 7, 8, 9], 5)  # an earlier exchange, since undone
    exchange = Job("hi", SamplingConfig(seed=1), "balanced", drafter=AUTO, own_pool=True)
    own = job_row(tiny_lm, exchange, 0, auto)[0].drafter
    assert own is not None and own.pool is not auto.pool
    assert (own.pool.tokens, own.pool.shape, own.pool.ngram_max) == (0, auto.pool.shape, auto.pool.ngram_max)
    assert auto.pool.tokens == 5  # the engine's pool keeps what it learned
    assert job_row(tiny_lm, dataclasses.replace(exchange, own_pool=False), 0, auto)[0].drafter is auto
