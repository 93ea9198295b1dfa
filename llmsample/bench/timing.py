"""Clocks for the benchmarks: tokens per second with queued GPU work waited for, and sides run
in rounds so that a noisy neighbour slows them alike.

A shared machine's speed moves by a quarter within minutes, more than what separates two loops
that are close. So every side runs once per round, the order rotating from round to round (no
side always goes first, after a pause or just after the other), and a ratio is the median of the
rounds' own ratios: the two runs of a round saw the same neighbours, which a ratio of the sides'
medians, taken from different rounds, does not cancel."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from llmsample.bench.results import Generate, Workload

T = TypeVar("T")


@dataclass
class Timings:
    """One workload's figures as the runs come in; ``result`` takes the medians."""

    workload: str
    ours: list[float] = field(default_factory=list)  # tokens/s, one per run
    theirs: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    loaded: list[float] = field(default_factory=list)  # transformers on the model as its users load it

    def result(self) -> Workload:
        ours, theirs = statistics.median(self.ours), statistics.median(self.theirs) if self.theirs else None
        return Workload(
            workload=self.workload,
            ours_tok_s=ours,
            reference_tok_s=theirs,
            ratio=paired_ratio(self.ours, self.theirs) if self.theirs else None,
            ttft_s=statistics.median(self.ttft) if self.ttft else None,
            runs=len(self.ours),
        )

    def generate_result(self) -> Generate:
        """:meth:`result` with the figures against transformers' own load."""
        return Generate(
            **dataclasses.asdict(self.result()),
            loaded_reference_tok_s=statistics.median(self.loaded),
            loaded_ratio=paired_ratio(self.ours, self.loaded),
        )


def synchronize() -> None:
    """Wait for queued GPU work, so a clock measures it (nothing to wait for on a CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed_tokens_per_s(run: Callable[[], int]) -> float:
    """End-to-end tokens per second, prefill included, for both sides alike."""
    synchronize()
    start = time.perf_counter()
    tokens = run()
    synchronize()
    return tokens / (time.perf_counter() - start)


def rounds(runs: int, sides: Sequence[Callable[[], T]]) -> list[list[T]]:
    """Each side's figures over ``runs`` rounds of every side once, round ``r`` starting at side
    ``r mod len(sides)``: ``figures[side][round]``."""
    figures: list[list[T]] = [[] for _ in sides]
    for r in range(runs):
        for k in range(len(sides)):
            side = (r + k) % len(sides)
            figures[side].append(sides[side]())
    return figures


def paired_ratio(mine: Sequence[float], theirs: Sequence[float]) -> float:
    """The median over rounds of ``mine[round] / theirs[round]``."""
    return statistics.median(a / b for a, b in zip(mine, theirs, strict=True))


def interleave(
    timings: Timings,
    runs: int,
    mine: Callable[[], int],
    reference: Callable[[], int] | None,
    loaded: Callable[[], int] | None = None,
) -> Timings:
    """The sides in rotating rounds (:func:`rounds`), tokens/s into ``timings``: ours, the
    reference on our model, and the reference on the model as its users load it."""
    named = [(timings.ours, mine), (timings.theirs, reference), (timings.loaded, loaded)]
    present = [(into, run) for into, run in named if run is not None]
    figures = rounds(runs, [lambda run=run: timed_tokens_per_s(run) for _, run in present])
    for (into, _), measured in zip(present, figures, strict=True):
        into.extend(measured)
    return timings
