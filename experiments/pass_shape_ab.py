"""``--draft auto``'s lengths priced with this machine's pass shape against another CPU's
(:mod:`llmsample.engine.pass_cost`: the EPYC's with AVX512-BF16 and the plain one), the default
run's own ``generate`` on ``llmsample bench --vs-llamacpp``'s workloads, greedy and sampled, in one
process, rotating rounds: each side's tok/s and drafted/accepted, and the median of the rounds'
ratios. ``PYTHONPATH=. python experiments/pass_shape_ab.py [--tokens 256] [--rounds 3]``."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import llmsample.engine.suffix_pool as suffix_pool
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.bench.vs_llamacpp import MODES, WORKLOADS, DefaultGenerate, Workload, load_default
from llmsample.engine.pass_cost import BF16_SHAPE, PLAIN_SHAPE, PassShape

SHAPES = {"bf16": BF16_SHAPE, "plain": PLAIN_SHAPE}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ours = DefaultGenerate(load_default([]), ["-n", str(args.tokens)])
    chosen = [PLAIN_SHAPE]
    suffix_pool.machine_shape = lambda: chosen[0]  # every request's fresh pool reads it

    def side(workload: Workload, name: str, shape: PassShape) -> Callable[[], float]:
        def run() -> float:
            chosen[0] = shape
            rate, counts = workload.ours(), workload.ours_counts
            print(f"    {name:6s} {rate:6.1f} tok/s  drafted {counts.drafted} accepted {counts.accepted}", flush=True)
            return rate

        return run

    Workload(ours, None, ["Say hello."], ["-n", "8"]).ours()  # type: ignore[arg-type]  # first touch
    for name, make_prompts in WORKLOADS.items():
        for mode, flags in MODES.items():
            workload = Workload(ours, None, make_prompts(), flags)  # type: ignore[arg-type]  # no peer
            bf16, plain = rounds(args.rounds, [side(workload, key, shape) for key, shape in SHAPES.items()])
            print(f"{name:17s} {mode:8s} bf16 {statistics.median(bf16):6.1f}  plain {statistics.median(plain):6.1f}  "
                  f"plain/bf16 {paired_ratio(plain, bf16):.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
