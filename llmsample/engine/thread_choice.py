"""llama.cpp's threads for each pass, chosen by measuring passes rather than assumed.

A pass runs on every core by default, and its threads meet at a barrier after each operation:
when another job holds one of the cores, every barrier waits for the thread that core runs, and
the pass takes several times as long as it would on the cores that are free (llama-cpp-python
on 2 cores beside a busy loop on one: 3.6 tok/s at 2 threads, 24-26 at 1, on a loaded
machine, 2026-12-06). So now and then a few passes run one thread fewer (or, once fewer won,
one more), and the count whose passes were faster, at the same width, is kept. A pass's numbers
do not depend on its threads (llama.cpp splits the outputs, not the sums: the default model's
logits were equal to the bit at 1 and 2 threads, mixed within a run), so this moves speed only.

A probe starts when the share of the cores that other processes use crosses :data:`BUSY` (read
from ``/proc/stat`` less this process's own time, every :data:`SAMPLE_S`: another job started
or ended), once :data:`PROBE` passes at the kept count measured it under the new load, and now
and then besides, at most every :data:`LONGEST` passes (a probe that loses
waits twice as long for the next), so on a quiet machine the probes cost a few hundredths of a
percent."""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable

FIRST = 256
"""Passes before the first probe that no change of load started."""

LONGEST = 4096
"""The most passes between two probes."""

PROBE = 3
"""Passes a probe runs at the other count, compared with as many just before it at the same width."""

MARGIN = 0.85
"""A probe's median must be under this share of the kept count's to be kept instead."""

SLOWED = 1.5
"""Passes at the kept count this many times slower than the fastest seen at their width: probe now."""

BUSY = 0.25
"""Cores' worth of time other processes use, above which the machine counts as busy."""

SAMPLE_S = 0.25
"""Seconds between two readings of what other processes use."""


def others_cpu_s() -> float | None:
    """CPU seconds every other process has used since boot (None where ``/proc/stat`` is not)."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = [int(value) for value in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
    mine = os.times()
    return busy / os.sysconf("SC_CLK_TCK") - mine.user - mine.system


class ThreadChoice:
    """The threads for the next pass of a context that may use up to ``most``: :meth:`next`
    before a pass, :meth:`timed` after it. ``others``: the CPU seconds other processes have
    used (:func:`others_cpu_s`), ``clock`` the seconds (tests give their own)."""

    def __init__(
        self,
        most: int,
        others: Callable[[], float | None] = others_cpu_s,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.others, self.clock = others, clock
        self.most, self.current = most, most
        self.wait = self.countdown = FIRST
        self.probe: int | None = None  # the count a probe runs, while it runs
        self.left = 0  # passes left in the probe
        self.fewer = True  # the next probe tries one thread fewer (else one more)
        self.times: dict[tuple[int, int], deque[float]] = {}  # (threads, width): the last passes' seconds
        self.fastest: dict[int, float] = {}  # width: the fastest median at the kept count
        self.busy = False  # other processes use BUSY cores or more
        self.read = (clock(), others()) if most > 1 else (0.0, None)

    def next(self) -> int:
        """Threads for the next pass."""
        if self.probe is None and self.most > 1:
            self.countdown -= 1
            if self._load_changed():  # measure the kept count under the new load first
                self.countdown = PROBE + 1
                for key in [key for key in self.times if key[0] == self.current]:
                    del self.times[key]
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

    def _load_changed(self) -> bool:
        """Whether other processes' share of the cores crossed :data:`BUSY` since the last reading."""
        now, before = self.clock(), self.read
        if before[1] is None or now - before[0] < SAMPLE_S:
            return False
        used = self.others()
        if used is None:
            return False
        self.read = (now, used)
        busy = (used - before[1]) / (now - before[0]) >= BUSY
        changed, self.busy = busy != self.busy, busy
        if changed:  # fewer threads when others came, more when they went
            self.wait, self.fewer = FIRST, busy
        return changed

    def _start(self) -> None:
        """A probe of one thread fewer or one more than the kept count, alternating where both exist."""
        options = [n for n in (self.current - 1, self.current + 1) if 1 <= n <= self.most]
        self.probe = options[0] if len(options) == 1 or self.fewer else options[1]
        self.fewer = not self.fewer
        self.left = PROBE
        for key in [key for key in self.times if key[0] == self.probe]:
            del self.times[key]  # an earlier probe's passes are no measure of now
