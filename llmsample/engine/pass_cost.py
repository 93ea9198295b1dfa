"""What a forward pass costs by its width (the positions it computes), and the draft length that
makes the most tokens a second of it.

A pass's cost is not linear in its width, and its shape is the CPU's. On the default model
(llama.cpp F16, 2 cores, one row; ``docs/history/2026-12.md``):

- AMD EPYC with AVX512-BF16: one position ~11 ms, two ~19, then ~2.3 ms a position (sixteen
  ~52). A one-position pass runs llama.cpp's matrix-vector kernels and a wider one its matrix
  kernels, so the first drafted position costs most: an unsure single token does not pay.
- Intel Xeon with AVX512 but not BF16: one position ~22.5 ms, two ~27, then ~3.6 ms a position
  (sixteen ~78). The one-position pass is the slow one, so drafts pay sooner and run longer.

The shape is fixed for a machine, not timed as the loop runs: a pass of several positions rounds
apart from one-token passes, so a length that followed the machine's load would make a seed's
text depend on it (timed lengths parted ``chat`` from ``generate`` on 2 of 20 seeds under the
test suite's load, ``tests/commands/test_one_seed.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassShape:
    """A pass's cost by width, in one-position passes: ``second`` for two positions, then ``step``
    for each position after the second."""

    second: float
    step: float

    def cost(self, width: int) -> float:
        """A pass of ``width`` positions, in one-position passes."""
        return 1.0 if width <= 1 else self.second + self.step * (width - 2)


BF16_SHAPE = PassShape(19.0 / 11.0, 2.3 / 11.0)
"""Measured on a 2-core AMD EPYC with AVX512-BF16."""

PLAIN_SHAPE = PassShape(27.0 / 22.5, 3.6 / 22.5)
"""Measured on a 2-core Intel Xeon with AVX512 and no BF16: where a CPU has no AVX512-BF16."""


def machine_shape() -> PassShape:
    """The shape for this machine's CPU (its features, so the same on every run here)."""
    from llmsample.models.device import native_bf16_cpu

    return BF16_SHAPE if native_bf16_cpu() else PLAIN_SHAPE


def best_length(joints: list[float], rows: int, shape: PassShape) -> int:
    """How many of a draft's tokens a row of a pass of ``rows`` rows sends, ``joints[i]`` being the
    chance that its first ``i + 1`` are all kept: the length whose pass is expected to make the
    most tokens for its cost, ``(rows + sum(joints[:length])) / shape.cost(rows + length)`` (each
    row makes one token a pass and its accepted drafts; the others' drafts are not counted)."""
    best, best_rate, expected = 0, rows / shape.cost(rows), float(rows)
    for length, joint in enumerate(joints, 1):
        expected += joint
        rate = expected / shape.cost(rows + length)
        if rate > best_rate:
            best, best_rate = length, rate
    return best
