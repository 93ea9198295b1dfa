"""What a pass costs by its width, and the draft length chosen from it (hand-computed rates)."""

from __future__ import annotations

import dataclasses

import pytest

from llmsample.engine.pass_cost import SECOND, STEP, best_length, pass_cost
from llmsample.engine.suffix_pool import PRIOR, REACH, SuffixPool, auto_drafter, suffix_drafter


def test_a_pass_costs_its_first_drafted_position_most() -> None:
    # The default model, llama.cpp F16, 2 cores: ~11 ms, ~19, then ~2.3 ms a position.
    assert [pass_cost(w) for w in (1, 2, 3, 16)] == pytest.approx([1.0, 19 / 11, 21.3 / 11, (19 + 14 * 2.3) / 11])
    assert SECOND > 1.5 and STEP < 0.25


def test_the_length_is_the_one_with_the_most_tokens_for_its_cost() -> None:
    # Costs 1, 1.727, 1.936, 2.145 (one-position passes). One token kept 70 % of the time:
    # 1.7 / 1.727 = 0.984 < 1 — it does not pay.
    assert best_length([0.7], 1) == 0
    # .9, .8, .7: 1.9 / 1.727 = 1.10, 2.7 / 1.936 = 1.39, 3.4 / 2.145 = 1.58 — the whole draft.
    assert best_length([0.9, 0.8, 0.7], 1) == 3
    # 1.95 / 1.727 = 1.129, 2.25 / 1.936 = 1.162, 2.3 / 2.145 = 1.072: two of three.
    assert best_length([0.95, 0.3, 0.05], 1) == 2
    # Four rows: 4 / 2.145 = 1.864; a fifth position kept half the time 4.5 / 2.355 = 1.911, a
    # third of the time 4.3 / 2.355 = 1.826.
    assert best_length([0.5], 4) == 1
    assert best_length([0.3], 4) == 0
    assert best_length([], 1) == 0


def sure_pool(priced: bool) -> SuffixPool:
    """A pool that has seen 0..8 five times, whose sure tokens the target kept 75 % of the time."""
    pool = SuffixPool(2, 3, min_prob=0.6, priced=priced)
    for _ in range(5):
        pool.extend(pool.open(), [0, 1, 2, 3, 4, 5, 6, 7, 8], 9)
    for _ in range(25):
        pool.scored([1.0, 1.0, 1.0, 1.0], 3)
    return pool


def test_a_pool_that_prices_its_passes_drafts_what_pays() -> None:
    kept = (75 + PRIOR) / (100 + PRIOR)  # .7525: the chance of each token; all of five: .241
    assert kept**5 > REACH > kept**6
    # A floor of 0.6 alone: one token (.7525, then .566).
    assert sure_pool(False).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4]
    # Priced: 1.7525 / 1.727 = 1.015, 2.319 / 1.936 = 1.198, 2.745 / 2.145 = 1.279,
    # 3.066 / 2.355 = 1.302, 3.307 / 2.564 = 1.290: four tokens.
    assert sure_pool(True).confident([1, 2, 3], [4, 5, 6, 7, 8])[0] == [4, 5, 6, 7]
    # Four rows sharing the pass: 4 / 2.145 = 1.864, then 4.7525 / 2.355 = 2.018, 5.319 / 2.564
    # = 2.075, 5.745 / 2.773 = 2.072: two.
    assert sure_pool(True).confident([1, 2, 3], [4, 5, 6, 7, 8], rows=4)[0] == [4, 5]


def test_suffix_prices_its_drafts_and_auto_keeps_the_floor(tiny_lm) -> None:
    """The default keeps one text for a seed across commands (tests/commands/test_one_seed.py)."""
    on_llama_cpp = dataclasses.replace(tiny_lm, backend="llama.cpp")
    auto = auto_drafter(on_llama_cpp)
    assert suffix_drafter(on_llama_cpp).pool.priced and auto is not None and not auto.pool.priced
