"""Decode steps of several rows on llama.cpp with the rows in one unified KV cache against a
stream per row (``LlamaCppBatch``'s two layouts), nothing of ours between the passes: rows of
80-token prompts, each stepped 64 times; the layouts alternate, and a round's figure is the
median step. The default model's F16 GGUF, its threads.
``PYTHONPATH=. python experiments/stream_steps.py [--rounds 3] [--rows 4 16]``."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import llmsample.engine.llamacpp_batch as layout
from llmsample.engine.llamacpp_batch import LlamaCppBatch
from llmsample.models.loading import load_model

PROMPT, STEPS = 80, 64


def median_step(lm, rows: int, streams: bool, kept: int) -> float:
    """The median ms of a step of ``rows`` rows; ``kept`` prompt-cache prefixes of PROMPT
    positions live beside them (in the unified cache's cells; a stream layout keeps them in host
    memory)."""
    layout.STREAMS_ROWS, layout.STREAMS_COST = (2, 1 << 20) if streams else (1 << 20, 0)
    backend = LlamaCppBatch(lm.model, rows, PROMPT + STEPS + 8, cache_bytes=(kept + 1) * PROMPT * lm.model.cell_bytes())
    try:
        for k in range(kept):
            backend.admit([[(7 * k + i) % 40000 + 100 for i in range(PROMPT)]])
            if backend.can_save(PROMPT):
                backend.save(0, PROMPT)
            backend.keep([])
        backend.admit([[(13 * r + i) % 40000 + 100 for i in range(PROMPT)] for r in range(rows)])
        fed, times = torch.tensor([100 + r for r in range(rows)]), []
        for _ in range(STEPS):
            start = time.perf_counter()
            backend.step(fed)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times)
    finally:
        backend.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--kept", type=int, default=0)
    args = parser.parse_args()
    lm = load_model(None, "cpu", "auto", backend="llama.cpp")
    print(f"{lm.model.path.name}, {lm.model.threads} threads, {args.kept} kept prefixes")
    for rows in args.rows:
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {streams: median_step(lm, rows, streams, args.kept) for streams in order}
            print(f"{rows:3d} rows  unified {got[False]:6.1f} ms  streams {got[True]:6.1f} ms  ratio {got[False] / got[True]:.2f}")


if __name__ == "__main__":
    main()
