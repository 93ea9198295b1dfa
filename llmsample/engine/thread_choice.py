"""llama.cpp's threads for each pass, chosen by measuring passes rather than assumed.

A pass runs on every core by default, and its threads meet at a barrier after each operation:
when another job holds one of the cores, every barrier waits for the thread that core runs, and
the pass takes several times as long as it would on the cores that are free (llama-cpp-python
on 2 cores beside a busy loop on one: 3.6 tok/s at 2 threads, 24-26 at 1, on a loaded
machine, 2026-12-06). So now and then a few passes run one thread fewer (or, once fewer won,
one more), and the count whose passes were faster, at the same width, is kept. A pass's numbers
do not depend on its threads (llama.cpp splits the outputs, not the sums: the default model's
logits were equal to the bit at 1 and 2 threads, mixed within a run), so this moves speed only.

A probe that loses waits twice as long for the next, up to :data:`LONGEST` passes, so on a quiet
machine the probes cost a few tenths of a percent; passes slowing down by :data:`SLOWED` at the
count kept start one at once (another job started)."""

from __future__ import annotations

import statistics
from collections import deque

FIRST = 64
"""Passes before the first probe."""

LONGEST = 1024
"""The most passes between two probes."""

PROBE = 3
"""Passes a probe runs at the other count, compared with as many just before it at the same width."""

MARGIN = 0.85
"""A probe's median must be under this share of the kept count's to be kept instead."""

SLOWED = 1.5
"""Passes at the kept count this many times slower than the fastest seen at their width: probe now."""


class ThreadChoice:
    """The threads for the next pass of a context that may use up to ``most``: :meth:`next`
    before a pass, :meth:`timed` after it."""

    def __init__(self, most: int) -> None:
        self.most, self.current = most, most
        self.wait = self.countdown = FIRST
        self.probe: int | None = None  # the count a probe runs, while it runs
        self.left = 0  # passes left in the probe
        self.fewer = True  # the next probe tries one thread fewer (else one more)
        self.times: dict[tuple[int, int], deque[float]] = {}  # (threads, width): the last passes' seconds
        self.fastest: dict[int, float] = {}  # width: the fastest median at the kept count

    def next(self) -> int:
        """Threads for the next pass."""
        if self.probe is None and self.most > 1:
            self.countdown -= 1
            if self.countdown <= 0:
                self._start()
        return self.current if self.probe is None else self.probe

    def timed(self, threads: int, width: int, seconds: float) -> None:
        """A pass of ``width`` tokens took ``seconds`` at ``threads``."""
        recent = self.times.setdefault((threads, width), deque(maxlen=PROBE))
        recent.append(seconds)
        if self.probe is None:
            if len(recent) == PROBE and threads == self.current:
                median = statistics.median(recent)
                fastest = self.fastest.setdefault(width, median)
                if median > SLOWED * fastest:  # slowed down: another job, most likely
                    self.fastest[width], self.countdown, self.wait = median, 0, FIRST
                else:
                    self.fastest[width] = min(fastest, median)
            return
        self.left -= 1
        if self.left > 0:
            return
        kept = self.times.get((self.current, width))
        won = (
            kept is not None
            and len(kept) == len(recent) == PROBE
            and statistics.median(recent) < MARGIN * statistics.median(kept)
        )
        if won:
            self.current, self.wait, self.fastest = threads, FIRST, {}
        else:
            self.wait = min(2 * self.wait, LONGEST)
        self.probe, self.countdown = None, self.wait

    def _start(self) -> None:
        """A probe of one thread fewer or one more than the kept count, alternating where both exist."""
        options = [n for n in (self.current - 1, self.current + 1) if 1 <= n <= self.most]
        self.probe = options[0] if len(options) == 1 or self.fewer else options[1]
        self.fewer = not self.fewer
        self.left = PROBE
        for key in [key for key in self.times if key[0] == self.probe]:
            del self.times[key]  # an earlier probe's passes are no measure of now
