"""What a pass costs by its width, and the draft length chosen from it (hand-computed rates)."""

from __future__ import annotations

import dataclasses

import pytest

from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.pass_cost import FADE, PassCost
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.suffix_pool import PRIOR, REACH, SuffixPool, suffix_drafter
from llmsample.events import RunStats
from llmsample.sampling.config import SamplingConfig

DEFAULT_MODEL = {1: 11.0, 2: 19.0, 3: 21.0, 4: 23.0, 5: 25.0, 6: 27.0}
"""Milliseconds of the default model's passes by width (llama.cpp F16, 2 cores), rounded."""


def measured(seconds: dict[int, float]) -> PassCost:
    cost = PassCost()
    for width, value in seconds.items():
        cost.measured(width, value)
    return cost


def test_a_wide_pass_is_read_off_the_line_through_the_wide_passes_measured() -> None:
    cost = PassCost()
    assert cost.estimate(1) is None and not cost.known
    cost.measured(1, 11.0)
    assert cost.estimate(2) is None and not cost.known  # one width says nothing of growth
    cost.measured(3, 21.0)
    assert cost.estimate(2) == pytest.approx(16.0)  # one wide width: the line through it and 1
    cost.measured(8, 31.0)
    assert cost.estimate(1) == 11.0  # a one-position pass is its own
    assert [cost.estimate(w) for w in (2, 5, 10)] == pytest.approx([19.0, 25.0, 35.0])  # 3..8: 15 + 2w
    cost.measured(8, 41.0)
    assert cost.seconds[8] == pytest.approx(31.0 + FADE * 10.0)  # the average follows
    cost.measured(5, 40.0)  # once, at a busy moment
    # Weights 1, 1, 2 at widths 3, 5, 8 (21, 40, 33): mean width 6, mean 31.75, slope 29 / 18.
    assert cost.estimate(5) == pytest.approx(31.75 - 29 / 18)
    assert measured({4: 36.0, 6: 40.0}).estimate(1) == pytest.approx(30.0)  # below the narrowest
    assert measured({2: 20.0, 4: 10.0}).estimate(8) == pytest.approx(15.0)  # never cheaper wider


def test_the_length_is_the_one_with_the_most_tokens_a_second() -> None:
    cost = measured(DEFAULT_MODEL)
    # 1/11 = .0909 a ms alone; one token kept 70 % of the time: 1.7/19 = .0895 — it does not pay.
    assert cost.best_length([0.7], 1) == 0
    # .9, .8, .7 all kept: 1.9/19 = .100, 2.7/21 = .129, 3.4/23 = .148 — the whole draft.
    assert cost.best_length([0.9, 0.8, 0.7], 1) == 3
    # 1.95/19 = .1026, 2.25/21 = .1071, 2.3/23 = .1000: two of three.
    assert cost.best_length([0.95, 0.3, 0.05], 1) == 2
    # Four rows: 4/36 = .1111 a ms; a fifth position for a token kept 30 % of the time: 4.3/38 = .1132.
    assert measured({4: 36.0, 5: 38.0}).best_length([0.3], 4) == 1
    assert PassCost().best_length([0.9], 1) is None  # nothing measured: the floor's cut stands


def sure_pool(cost: PassCost | None) -> SuffixPool:
    """A pool that has seen 0..8 five times, whose sure tokens the target kept 75 % of the time."""
    pool = SuffixPool(2, 3, min_prob=0.6, cost=cost)
    for _ in range(5):
        pool.extend(pool.open(), [0, 1, 2, 3, 4, 5, 6, 7, 8], 9)
    for _ in range(25):
        pool.scored([1.0, 1.0, 1.0, 1.0], 3)
    return pool


def test_a_pool_that_knows_what_passes_cost_drafts_what_pays() -> None:
    kept = (75 + PRIOR) / (100 + PRIOR)  # .7525: the chance of each token; all of five: .241
    assert kept**5 > REACH > kept**6
    # A floor of 0.6 alone: one token (.7525, then .566).
    assert sure_pool(None).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]
    assert sure_pool(PassCost()).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]  # not measured yet
    # The default model's costs: 1.7525/19 = .0922, 2.319/21 = .1104, 2.745/23 = .1193,
    # 3.065/25 = .1226, 3.306/27 = .1224: four tokens.
    assert sure_pool(measured(DEFAULT_MODEL)).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4, 5, 6, 7]
    # Where every position costs as much as the first drafted (8 ms): 1.7525/19, then 2.319/27: one.
    assert sure_pool(measured({1: 11.0, 2: 19.0})).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]


def test_the_loop_tells_the_pool_what_its_passes_cost(tiny_lm) -> None:
    """A drafting row's passes, plain and verifying, are timed by their widths."""
    made = suffix_drafter(dataclasses.replace(tiny_lm, backend="llama.cpp"), (1, 2))
    cfg = SamplingConfig(temperature=0.0, max_tokens=40, seed=0)
    ids = encode_prompt(tiny_lm, "w4 w8 w15 w16 w23 w4 w8 w15 w16 w23 w4 w8 w15", raw=True)
    run_to_end(generate(tiny_lm, ids, cfg, RunStats("t", "t", 0), drafter=made(), ignore_eos=True))
    seconds = made.pool.cost.seconds if made.pool.cost is not None else {}
    assert 1 in seconds and any(width > 1 for width in seconds), seconds
    assert all(value > 0 for value in seconds.values())
