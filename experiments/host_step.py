"""Our work between two forward passes, alone: the real loop (chain, draw, figures, records, the
step's bookkeeping) over a backend that hands back rows of the default model's logits captured
once, so no forward pass runs. One row, every token's full record (top 5), EOS ignored. Per
setting, per token: the medians of the rounds' CPU time of this thread (what the step costs,
steady under a loaded host) and wall time (what it cost then).
``PYTHONPATH=. python bench/host_step.py [--rounds 5] [--tokens 128]``."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import torch

from llmsample.bench.llamacpp_peers import PROMPT, SETTINGS
from llmsample.engine.decode import DecodeOptions, run_rows
from llmsample.engine.feed import IterableFeed
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.row_state import BatchItem
from llmsample.events import RunStats, Summary
from llmsample.models.loading import LoadedModel, load_model
from llmsample.sampling import presets
from llmsample.sampling.config import SamplingConfig

CAPTURED = 64


class Canned:
    """A backend whose every pass hands back the next captured row (a copy, as a real pass's)."""

    sample_device = torch.device("cpu")
    can_join, ragged, compile_s = True, False, 0.0

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows, self.at = rows, 0

    def _next(self, *args: Any) -> torch.Tensor:
        self.at += 1
        return self.rows[(self.at - 1) % len(self.rows)][None].clone()

    admit = admit_copies = step = _next

    def keep(self, rows: list[int]) -> None:
        pass

    def rollback(self, row: int, length: int) -> None:
        pass

    def agree(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens


def capture(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """The model's logits along a sampled continuation of the prompt ``[CAPTURED, vocab]``."""
    generator, rows, past, fed = torch.Generator().manual_seed(0), [], None, ids
    with torch.no_grad():
        for _ in range(CAPTURED):
            out = lm.model(fed, past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1].float()
            rows.append(logits[0])
            fed = torch.multinomial((logits / 0.8).softmax(-1), 1, generator=generator)
    return torch.stack(rows)


def one_run(lm: LoadedModel, rows: torch.Tensor, prompt: list[int], cfg: SamplingConfig) -> tuple[float, float]:
    """Per token, after the first: CPU seconds of this thread and wall seconds."""
    item = BatchItem(0, prompt, cfg, RunStats(lm.name, "bench", cfg.seed))
    backend = Canned(rows)
    loop = run_rows(lm, [backend], IterableFeed([]), [item], 1, DecodeOptions(5, True), lambda joining: [backend.admit()])
    stamps = [(time.thread_time(), time.perf_counter()) for _, r in loop if not isinstance(r, Summary)]
    n = len(stamps) - 1
    return (stamps[-1][0] - stamps[0][0]) / n, (stamps[-1][1] - stamps[0][1]) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    lm = load_model(None, "cpu", "float32")
    ids = encode_prompt(lm, PROMPT)
    rows = capture(lm, ids)
    settings = {
        "greedy": SamplingConfig(temperature=0.0),
        "bench sampled": SamplingConfig(**SETTINGS),  # type: ignore[arg-type]
        presets.DEFAULT_PRESET: presets.load(presets.DEFAULT_PRESET)[1],
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    names = list(settings)
    for r in range(args.rounds):  # the order rotates from round to round
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cfg = dataclasses.replace(settings[name], max_tokens=args.tokens, seed=r)
            times[name].append(one_run(lm, rows, ids[0].tolist(), cfg))
    for name, runs in times.items():
        cpu, wall = (statistics.median(t[i] for t in runs) * 1e3 for i in (0, 1))
        print(f"{name:14s} cpu {cpu:.3f} ms/token  wall {wall:.3f} ms/token  ({len(runs)} rounds)")


if __name__ == "__main__":
    main()
