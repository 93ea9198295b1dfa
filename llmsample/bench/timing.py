"""Clocks for the benchmarks: tokens per second with queued GPU work waited for, and two sides
run in turn so that a noisy neighbour slows both alike (medians; ratios hold on a shared machine)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from llmsample.bench.results import Workload


@dataclass
class Timings:
    """One workload's figures as the runs come in; ``result`` takes the medians."""

    workload: str
    ours: list[float] = field(default_factory=list)  # tokens/s, one per run
    theirs: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)

    def result(self) -> Workload:
        ours, theirs = statistics.median(self.ours), statistics.median(self.theirs) if self.theirs else None
        return Workload(
            workload=self.workload,
            ours_tok_s=ours,
            reference_tok_s=theirs,
            ratio=ours / theirs if theirs else None,
            ttft_s=statistics.median(self.ttft) if self.ttft else None,
            runs=len(self.ours),
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


def interleave(timings: Timings, runs: int, mine: Callable[[], int], reference: Callable[[], int] | None) -> Timings:
    """Alternate the two sides run by run, so a noisy neighbour slows both alike."""
    for _ in range(runs):
        timings.ours.append(timed_tokens_per_s(mine))
        if reference:
            timings.theirs.append(timed_tokens_per_s(reference))
    return timings
