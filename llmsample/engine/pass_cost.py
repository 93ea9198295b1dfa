"""What a forward pass costs by its width (the positions it computes), and the draft length that
makes the most tokens a second of it.

A pass's cost is not linear in its width. On the default model (llama.cpp F16, 2 cores) one
position took ~11 ms, two ~19, three ~21, four ~23, eight ~30, sixteen ~52 (a one-position pass
runs llama.cpp's matrix-vector kernels, a wider one its matrix kernels): the first drafted
position costs most and each one after it little, so a confident draft pays longer than a fixed
floor on its chance lets it go, and an unsure single token does not pay at all
(docs/history/2026-12.md, 2026-12-06 evening).

The shape is fixed, not timed as the loop runs: a pass of several positions rounds apart from
one-token passes, so a length that followed the machine's load would make a seed's text depend on
it (timed lengths parted ``chat`` from ``generate`` on 2 of 20 seeds under the test suite's load,
``tests/commands/test_one_seed.py``)."""

from __future__ import annotations

SECOND = 19.0 / 11.0
"""A two-position pass, in one-position passes."""

STEP = 2.3 / 11.0
"""Each position after the second, in one-position passes."""


def pass_cost(width: int) -> float:
    """A pass of ``width`` positions, in one-position passes."""
    return 1.0 if width <= 1 else SECOND + STEP * (width - 2)


def best_length(joints: list[float], rows: int) -> int:
    """How many of a draft's tokens a row of a pass of ``rows`` rows sends, ``joints[i]`` being the
    chance that its first ``i + 1`` are all kept: the length whose pass is expected to make the
    most tokens for its cost, ``(rows + sum(joints[:length])) / pass_cost(rows + length)`` (each
    row makes one token a pass and its accepted drafts; the others' drafts are not counted)."""
    best, best_rate, expected = 0, rows / pass_cost(rows), float(rows)
    for length, joint in enumerate(joints, 1):
        expected += joint
        rate = expected / pass_cost(rows + length)
        if rate > best_rate:
            best, best_rate = length, rate
    return best
