"""``--draft auto``'s length chosen from what passes cost (:class:`llmsample.engine.pass_cost.PassCost`)
against the fixed floor alone (the pool never told it knows the costs), the default run's own
``generate`` on ``llmsample bench --vs-llamacpp``'s workloads, greedy and sampled, in one process,
rotating rounds: each side's tok/s and drafted/accepted, and the median of the rounds' ratios.
``PYTHONPATH=. python experiments/draft_cost_ab.py [--tokens 512] [--rounds 2]``."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import llmsample.engine.pass_cost as pass_cost
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.bench.vs_llamacpp import MODES, WORKLOADS, DefaultGenerate, Workload, load_default


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ours = DefaultGenerate(load_default([]), ["-n", str(args.tokens)])
    costed = [True]
    pass_cost.PassCost.known = property(lambda self: costed[0] and len(self.seconds) >= 2)  # type: ignore[method-assign]

    def side(workload: Workload, cost: bool) -> Callable[[], float]:
        def run() -> float:
            costed[0] = cost
            rate, counts = workload.ours(), workload.ours_counts
            print(f"    {'cost' if cost else 'floor'} {rate:6.1f} tok/s  drafted {counts.drafted} accepted {counts.accepted}")
            return rate

        return run

    Workload(ours, None, ["Say hello."], ["-n", "8"]).ours()  # type: ignore[arg-type]  # first touch
    for name, make_prompts in WORKLOADS.items():
        prompts = make_prompts()
        for mode, flags in MODES.items():
            workload = Workload(ours, None, prompts, flags)  # type: ignore[arg-type]  # no peer
            cost, floor = rounds(args.rounds, [side(workload, True), side(workload, False)])
            print(f"{name:17s} {mode:8s} cost {statistics.median(cost):6.1f}  floor {statistics.median(floor):6.1f}  "
                  f"ratio {paired_ratio(cost, floor):.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
