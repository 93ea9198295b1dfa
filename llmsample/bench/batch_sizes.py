"""The batch benchmark: many chat prompts of mixed lengths through ``decode_batch`` (every token's
record built) against transformers' padded batch ``generate``, on our loaded model and on the
model as transformers' users load it, at several batch sizes, in one process. Aggregate
tokens/s, EOS ignored, greedy, medians of rotating rounds (:mod:`llmsample.bench.timing`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from llmsample.bench.prompts import batch_prompts
from llmsample.bench.timing import paired_ratio, rounds
from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig


@dataclass(frozen=True)
class BatchRow:
    batch_size: int
    ours_tok_s: float
    reference_tok_s: float
    ratio: float
    model_share: float  # of our run's time, the model's forward passes; the rest is sampling and records
    loaded_reference_tok_s: float | None  # generate on the model as transformers' users load it
    loaded_ratio: float | None


def ours(lm: LoadedModel, prompts: list[list[int]], tokens: int, batch_size: int) -> tuple[int, float]:
    """Generated tokens, and seconds spent in the model's forward passes."""
    cfg = SamplingConfig(temperature=0.0, max_tokens=tokens, seed=0)
    items = [BatchItem(i, ids, cfg, RunStats(lm.name, "bench", 0)) for i, ids in enumerate(prompts)]
    spent = [0.0]

    def timed(seconds: float) -> None:
        spent[0] += seconds

    records = decode_batch(lm, items, batch_size, ignore_eos=True, on_forward=timed)
    count = sum(1 for _, r in records if not isinstance(r, Summary))
    return count, spent[0]


def theirs(lm: LoadedModel, prompts: list[list[int]], tokens: int, batch_size: int) -> int:
    """transformers' ``generate`` on static batches of the same prompts, left-padded."""
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.tokenizer.eos_token_id
    count = 0
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=lm.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=lm.device)
        with torch.inference_mode():
            out = lm.model.generate(
                ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                do_sample=False, pad_token_id=pad,
            )  # fmt: skip
        count += (out.shape[1] - width) * len(chunk)
    return count


def run_batch_benchmark(
    lm: LoadedModel, loaded: LoadedModel | None, sizes: list[int], runs: int = 3, tokens: int = 64, count: int = 32,
    log: Callable[[str], None] = lambda step: None,
) -> list[BatchRow]:  # fmt: skip
    """Per batch size, the sides (``loaded``: transformers' model as its users load it, when
    given) in ``runs`` rotating rounds over ``count`` prompts: medians, and the ratios paired by
    round."""
    prompts = [encode_prompt(lm, p)[0].tolist() for p in batch_prompts(count)]
    rows = []
    for size in sizes:
        log(f"batch size {size}")
        rows.append(_batch_row(lm, loaded, prompts, tokens, size, runs))
    return rows


def _batch_row(
    lm: LoadedModel, loaded: LoadedModel | None, prompts: list[list[int]], tokens: int, size: int, runs: int
) -> BatchRow:
    shares = []

    def mine() -> float:
        start = time.perf_counter()
        generated, model_s = ours(lm, prompts, tokens, size)
        elapsed = time.perf_counter() - start
        shares.append(model_s / elapsed)
        return generated / elapsed

    def reference(on: LoadedModel) -> float:
        start = time.perf_counter()
        return theirs(on, prompts, tokens, size) / (time.perf_counter() - start)

    if loaded:
        theirs(loaded, prompts[:size], 2, size)  # its first generate's set-up, outside the clock
    sides = [mine, lambda: reference(lm)] + ([lambda: reference(loaded)] if loaded else [])
    rates, their_rates, *loaded_rates = rounds(runs, sides)
    median = statistics.median
    return BatchRow(
        size, median(rates), median(their_rates), paired_ratio(rates, their_rates), median(shares),
        median(loaded_rates[0]) if loaded else None, paired_ratio(rates, loaded_rates[0]) if loaded else None,
    )  # fmt: skip


def rows_to_dict(rows: list[BatchRow]) -> list[dict[str, Any]]:
    """The rows as the JSON file's ``rows``."""
    return [asdict(row) for row in rows]
