"""What a forward pass costs by its width (the positions it computes), measured as the loop runs,
and the draft length that makes the most tokens a second of it.

A pass's cost is not linear in its width. On the default model (llama.cpp F16, 2 cores) one
position took ~11 ms, two ~19, three ~21, four ~23, eight ~30 (a one-position pass runs
llama.cpp's matrix-vector kernels, a wider one its matrix kernels): the first drafted position
costs most and each one after it little, so a confident draft pays longer than a fixed floor on
its chance lets it go, and an unsure single token does not pay at all
(docs/history/2026-12.md, 2026-12-06 evening)."""

from __future__ import annotations

FADE = 0.2
"""The weight a new measurement of a width takes in its average: the average follows the
machine's load within a few passes of that width."""

SETTLED = 8
"""Passes of a width after which its average weighs fully in the line through the wide widths."""


class PassCost:
    """Seconds a pass of each width took (an average that follows the latest passes), for one
    model: every row drafting for it shares one. A one-position pass is its own measurement; a
    wider one is read off the line through the wider widths measured (weighted by how often
    each was, up to :data:`SETTLED`), so that a width measured once or twice, at a moment the
    machine was busy, cannot make a wider pass look cheaper than a narrower one."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self.passes: dict[int, int] = {}

    def measured(self, width: int, seconds: float) -> None:
        """A pass of ``width`` positions took ``seconds``."""
        old = self.seconds.get(width)
        self.seconds[width] = seconds if old is None else old + FADE * (seconds - old)
        self.passes[width] = self.passes.get(width, 0) + 1

    @property
    def known(self) -> bool:
        """Whether two widths are measured: enough to tell how the cost grows."""
        return len(self.seconds) >= 2

    def estimate(self, width: int) -> float | None:
        """Seconds for a pass of ``width`` positions: a one-position pass's average, else the
        line through the wider passes (through the one-position pass and the one wider width
        while only one is measured; its slope at least 0). None until two widths are measured."""
        if not self.known:
            return None
        if width == 1 and 1 in self.seconds:
            return self.seconds[1]
        wide = [w for w in self.seconds if w > 1]
        points = wide if len(wide) >= 2 else sorted(self.seconds)[:2]
        weights = [min(self.passes[w], SETTLED) for w in points]
        total = sum(weights)
        mean_w = sum(k * w for k, w in zip(weights, points, strict=True)) / total
        mean_s = sum(k * self.seconds[w] for k, w in zip(weights, points, strict=True)) / total
        spread = sum(k * (w - mean_w) ** 2 for k, w in zip(weights, points, strict=True))
        slope = sum(k * (w - mean_w) * (self.seconds[w] - mean_s) for k, w in zip(weights, points, strict=True)) / spread
        return max(mean_s + max(slope, 0.0) * (width - mean_w), 0.0)

    def best_length(self, joints: list[float], rows: int) -> int | None:
        """How many of a draft's tokens a row of a pass of ``rows`` rows sends, ``joints[i]``
        being the chance that its first ``i + 1`` are all kept: the length whose pass is expected
        to make the most tokens a second, ``(rows + sum(joints[:length])) / cost(rows + length)``
        (each row makes one token a pass and its accepted drafts; the others' drafts are not
        counted). None while the cost's growth is unmeasured."""
        base = self.estimate(rows)
        if base is None:
            return None
        best, best_rate, expected = 0, rows / base if base > 0 else 0.0, float(rows)
        for length, joint in enumerate(joints, 1):
            expected += joint
            cost = self.estimate(rows + length)
            if cost is None or cost <= 0:
                return best
            if expected / cost > best_rate:
                best, best_rate = length, expected / cost
        return best
