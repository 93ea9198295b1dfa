"""Each sweep metric on hand-computed cases (docs/sampling.md gives the formulas)."""

from __future__ import annotations

import math

import pytest

from llmsample.errors import UserError
from llmsample.sweep.metrics import (
    Interval,
    detector,
    distinct,
    ended_early,
    interval,
    loops,
    repeats,
    sample_metrics,
    self_bleu,
)
from llmsample.sweep.samples import prompts_language
from llmsample.sweep.summary import pareto


def test_repeats_is_any_four_gram_twice() -> None:
    assert repeats([1, 2, 3, 4, 9, 1, 2, 3, 4])
    assert not repeats([1, 2, 3, 4, 9, 1, 2, 3, 5])  # a repeated 3-gram is not enough
    assert not repeats([1, 2, 3])


def test_loops_is_a_span_three_times_back_to_back_at_the_end() -> None:
    assert loops([7, 8, 5, 5, 5])  # one token three times
    assert loops([9, 1, 2, 3, 1, 2, 3, 1, 2, 3])
    assert not loops([1, 2, 3, 1, 2, 3, 9])  # the loop broke off
    assert not loops([1, 2, 1, 2])  # twice is not a loop
    assert loops(list(range(32)) * 3) and not loops(list(range(33)) * 3)  # at most 32 tokens a span


def test_an_early_end_is_end_of_text_before_a_tenth_of_the_tokens() -> None:
    assert ended_early("eos", 9, 100) and not ended_early("eos", 10, 100)
    assert not ended_early("length", 3, 100) and not ended_early("context", 3, 100)  # not early


def test_distinct_n_is_unique_ngrams_over_all_across_the_seeds() -> None:
    samples = [[1, 2, 3], [1, 2, 4]]
    assert distinct(samples, 1) == pytest.approx(4 / 6)  # {1, 2, 3, 4} of 6 tokens
    assert distinct(samples, 2) == pytest.approx(3 / 4)  # (1,2) twice, (2,3), (2,4)
    assert distinct(samples, 3) == pytest.approx(2 / 2)


def test_self_bleu_by_hand() -> None:
    # 1-4 gram precisions of one against the other: 4/5, 3/4, 2/3, 1/2; equal lengths (no brevity
    # penalty); BLEU is their geometric mean, and the two directions agree.
    by_hand = (4 / 5 * 3 / 4 * 2 / 3 * 1 / 2) ** (1 / 4)
    assert self_bleu([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]) == pytest.approx(by_hand, rel=1e-9)
    assert self_bleu([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]]) == pytest.approx(1.0)
    assert self_bleu([[1, 2, 3, 4]]) is None


def test_interval_is_the_mean_and_196_standard_errors() -> None:
    found = interval([1.0, 2.0, 3.0])
    assert found == Interval(2.0, pytest.approx(1.96 / math.sqrt(3)), 3)
    assert found.to_dict() == {"mean": 2.0, "low": 2.0 - found.half, "high": 2.0 + found.half, "n": 3}
    assert interval([5.0]) == Interval(5.0, 0.0, 1) and interval([]) is None


def test_the_pareto_front_keeps_what_nothing_beats_on_both() -> None:
    def at(x: float, y: float) -> tuple[Interval, Interval]:
        return Interval(x, 0, 1), Interval(y, 0, 1)

    points = [at(0.5, -1.0), at(0.7, -1.5), at(0.4, -1.2), at(0.7, -1.5), (None, None)]
    assert pareto(points, True, True) == {0, 1, 3}  # 2 is beaten by 0; 1 and 3 tie; 4 has no figures
    assert pareto([at(0.2, -1.0), at(0.5, -0.9)], False, True) == {0, 1}  # lower x is better there


def test_a_samples_metrics_from_its_record() -> None:
    record = {"text": "le chat est sur la table", "tokens": 3, "stop_reason": "eos",
              "per_token": [{"token_id": 4, "model_prob": 0.5, "entropy": 1.0},
                            {"token_id": 5, "model_prob": 0.25, "entropy": 2.0},
                            {"token_id": 6, "model_prob": 1.0, "entropy": 0.0}]}  # fmt: skip
    found = sample_metrics(record, 100, "en", lambda text: "fr")
    assert found.logprob == pytest.approx((math.log(0.5) + math.log(0.25)) / 3)
    assert found.entropy == pytest.approx(1.0) and found.tokens == 3
    assert found.early_end and not found.repeats and not found.loops
    assert found.language == "fr" and found.off_language is True
    assert sample_metrics(record, 100, None, lambda text: "fr").off_language is None
    empty = sample_metrics({"text": "", "tokens": 0, "stop_reason": "eos", "per_token": []}, 100, "en", lambda t: None)
    assert empty.logprob is None and empty.entropy is None and empty.early_end  # 0 would be the best score


def test_the_language_detector() -> None:
    detect = detector()
    assert detect("The capital of France is Paris, a city of lights.") == "en"
    assert detect("La capitale de la France est Paris, la ville lumière.") == "fr"
    assert detect("Paris.") is None  # too few words to tell
    assert detect("1. Bananas\n2. Grapes\n3. Tomatoes\n4. Papayas") is None  # Tagalog at 0.06: cannot tell
    with pytest.raises(UserError, match="--language 'english': not a language code"):
        detector("english")


def test_the_prompts_language_is_read_from_all_of_them() -> None:
    detect = detector()
    assert detect("How do I boil an egg?") != "en"  # one line says too little
    prompts = [{"prompt": "How do I boil an egg?"}, {"messages": [{"role": "user", "content": "Write a poem about the sea."}]},
               {"prompt": "List four fruits that are red."}]  # fmt: skip
    assert prompts_language(prompts, detect) == "en"
