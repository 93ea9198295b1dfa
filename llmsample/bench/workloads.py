"""The workloads users run through ``llmsample batch``, each against its own baseline in one
process, in rotating rounds (:mod:`llmsample.bench.timing`), medians: requests with fresh seeds and four sampler settings against one
seed and one setting (what grouping rows by settings, not seeds, buys), and ``--draft ngram`` on
code rewrites (requests that copy from their input) against the same batch without drafting.
A rewrite runs to its own end, as a user's does: its answer is as long as the file it copies
(230–370 tokens here), and a cut after a few dozen tokens would weigh its 300-token prompt's
prefill, the same on both sides, several times over."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from llmsample.bench.prompts import batch_prompts, rewrite_prompts
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import NgramDrafter
from llmsample.events import RunStats, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig

SETTINGS = [(0.7, 0.9), (0.9, 0.95), (1.0, 0.8), (0.6, 1.0)]  # (temperature, top-p)


@dataclass(frozen=True)
class WorkloadRow:
    workload: str
    tok_s: float
    baseline: str
    baseline_tok_s: float
    ratio: float


REWRITES = 8  # two waves at batch 4
REWRITE_CAP = 512  # tokens; every rewrite here ends (EOS) well before


def _rate(lm: LoadedModel, items: list[BatchItem], batch_size: int, ignore_eos: bool = True) -> float:
    start = time.perf_counter()
    generated = sum(isinstance(r, TokenEvent) for _, r in decode_batch(lm, items, batch_size, ignore_eos=ignore_eos))
    return generated / (time.perf_counter() - start)


def _mixed(lm: LoadedModel, prompts: list[list[int]], tokens: int, fresh: bool) -> list[BatchItem]:
    """Every request its own seed and one of four settings, or all seed 0 with the first setting."""
    items = []
    for i, ids in enumerate(prompts):
        temperature, top_p = SETTINGS[i % len(SETTINGS)] if fresh else SETTINGS[0]
        cfg = SamplingConfig(temperature=temperature, top_p=top_p, max_tokens=tokens, seed=1000 + i if fresh else 0)
        items.append(BatchItem(i, ids, cfg, RunStats(lm.name, "bench", cfg.seed)))
    return items


def _rewrites(lm: LoadedModel, draft: bool) -> list[BatchItem]:
    """Greedy rewrites to their end (the same tokens with and without drafting)."""
    cfg = SamplingConfig(temperature=0.0, max_tokens=REWRITE_CAP, seed=0)

    def ngram() -> NgramDrafter:  # a row's own
        return NgramDrafter(lm.model.config.vocab_size, lm.sample_device)

    items = []
    for i, prompt in enumerate(rewrite_prompts(REWRITES)):
        ids = encode_prompt(lm, prompt)
        items.append(BatchItem(i, ids[0].tolist(), cfg, RunStats(lm.name, "bench", 0), ngram if draft else None))
    return items


def run_workload_benchmark(
    lm: LoadedModel, runs: int = 3, tokens: int = 64, log: Callable[[str], None] = lambda step: None
) -> list[WorkloadRow]:
    """Each workload and its baseline in ``runs`` rounds: medians, and ratios paired by round."""
    prompts = [encode_prompt(lm, p)[0].tolist() for p in batch_prompts(16)]
    log("fresh seeds and four settings against one seed and one setting, batch 8")
    mixed, uniform = rounds(
        runs,
        [
            lambda: _rate(lm, _mixed(lm, prompts, tokens, True), 8),
            lambda: _rate(lm, _mixed(lm, prompts, tokens, False), 8),
        ],
    )
    log("--draft ngram on code rewrites against no drafting, batch 4")
    drafted, plain = rounds(
        runs,
        [
            lambda: _rate(lm, _rewrites(lm, True), 4, ignore_eos=False),
            lambda: _rate(lm, _rewrites(lm, False), 4, ignore_eos=False),
        ],
    )
    return [
        WorkloadRow(
            "fresh seeds, 4 settings (batch 8)", statistics.median(mixed), "one seed, one setting",
            statistics.median(uniform), paired_ratio(mixed, uniform),
        ),
        WorkloadRow(
            "whole code rewrites, --draft ngram (batch 4)", statistics.median(drafted), "no drafting",
            statistics.median(plain), paired_ratio(drafted, plain),
        ),
    ]  # fmt: skip


def rows_to_dict(rows: list[WorkloadRow]) -> list[dict[str, Any]]:
    """The rows as the JSON file's ``rows``."""
    return [asdict(row) for row in rows]
