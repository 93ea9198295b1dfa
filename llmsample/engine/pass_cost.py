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


class PassCost:
    """Seconds a pass of each width took (an average that follows the latest passes), for one
    model: every row drafting for it shares one."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}

    def measured(self, width: int, seconds: float) -> None:
        """A pass of ``width`` positions took ``seconds``."""
        old = self.seconds.get(width)
        self.seconds[width] = seconds if old is None else old + FADE * (seconds - old)

    @property
    def known(self) -> bool:
        """Whether two widths are measured: enough to tell how the cost grows."""
        return len(self.seconds) >= 2

    def estimate(self, width: int) -> float | None:
        """Seconds for a pass of ``width``: measured, else on the line through the nearest
        measured widths on each side, or past the measured ones along the line through the two
        at that end. None until two widths are measured (nothing says yet how the cost grows)."""
        if width in self.seconds:
            return self.seconds[width]
        if not self.known:
            return None
        known = sorted(self.seconds)
        below = [w for w in known if w < width]
        above = [w for w in known if w > width]
        if below and above:
            a, b = below[-1], above[0]
        else:  # past the widest (or below the narrowest): the line through the two at that end
            a, b = known[-2:] if below else known[:2]
        slope = (self.seconds[b] - self.seconds[a]) / (b - a)
        return max(self.seconds[a] + slope * (width - a), 0.0)

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
