"""The benchmarks' protocol: sides in rounds whose order rotates, ratios paired by round."""

from __future__ import annotations

import statistics

import pytest

from llmsample.bench.timing import paired_ratio, rounds


def test_the_order_rotates_from_round_to_round() -> None:
    calls: list[str] = []

    def side(name: str):
        return lambda: calls.append(name) or f"{name}{len(calls)}"

    figures = rounds(3, [side("a"), side("b"), side("c")])
    assert "".join(calls) == "abc" + "bca" + "cab"
    assert figures == [["a1", "a6", "a8"], ["b2", "b4", "b9"], ["c3", "c5", "c7"]]
    calls.clear()
    rounds(4, [side("a"), side("b")])
    assert "".join(calls) == "ab" + "ba" + "ab" + "ba"


def test_a_ratio_is_the_median_of_the_rounds_own_ratios() -> None:
    # A machine that slows in round 2 and speeds up in round 3: the rounds say 0.91, 0.94, 1.2,
    # while the sides' medians (12 against 11) would say 1.09.
    assert paired_ratio([10, 30, 12], [11, 32, 10]) == pytest.approx(30 / 32)
    assert statistics.median([10, 30, 12]) / statistics.median([11, 32, 10]) == pytest.approx(12 / 11)
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])


def test_a_neighbour_that_changes_the_speed_between_rounds_cancels() -> None:
    """Both runs of a round at that round's speed, ours 0.98x theirs: the paired ratio is 0.98
    whatever the speeds; pairing runs of different rounds would not give it."""
    speeds = [1.0, 0.55, 1.3, 0.7, 0.9]
    calls = [0]

    def at_this_rounds_speed(rate: float):
        def run() -> float:
            calls[0] += 1
            return rate * speeds[(calls[0] - 1) // 2]

        return run

    mine, theirs = rounds(len(speeds), [at_this_rounds_speed(98.0), at_this_rounds_speed(100.0)])
    assert paired_ratio(mine, theirs) == pytest.approx(0.98)
