"""Our own autoregressive loop: prefill once, one cached forward pass per token, one event
per token, then a summary."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.emitter import Emitter
from llmsample.engine.runner import ModelRunner
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import draw, make_generator, sampler_chain


def generate(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: RunStats,
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
) -> Iterator[TokenEvent | Summary]:
    """Sample up to ``cfg.max_tokens`` tokens; stop at EOS, a stop string or the length.

    ``stats`` belongs to the caller so that an interrupted run still has its summary."""
    for _, item in generate_rows(lm, prompt_ids, cfg, [stats], [cfg.seed], top_n=top_n, ignore_eos=ignore_eos):
        yield item


def generate_rows(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: list[RunStats],
    seeds: list[int | None],
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
) -> Iterator[tuple[int, TokenEvent | Summary]]:
    """Several samples of one prompt advancing together, one forward pass per step; row i draws
    with its own generator seeded ``seeds[i]``, so it equals the same sample run alone.
    Yields ``(row, event)`` and ``(row, summary)`` when that row ends."""
    batch = len(stats)
    with ModelRunner.for_run(lm, batch, prompt_ids.shape[1] + cfg.max_tokens) as runner:
        for row_stats in stats:
            if runner.compile_s:
                row_stats.extra["compile_s"] = runner.compile_s
        generators = [make_generator(seed, lm.device) for seed in seeds]
        emitters = [Emitter(lm, cfg, row_stats, prompt_ids, ignore_eos) for row_stats in stats]
        ids = prompt_ids.expand(batch, -1)  # the same prompt in every row: no padding needed
        logits = runner.prefill(ids)
        history = TokenHistory.start(ids, logits.shape[-1], track=cfg.has_penalties)
        active = list(range(batch))
        while active:
            chain = sampler_chain(logits, history, cfg)
            tokens = runner.agree(torch.cat([draw(chain.probs[i : i + 1], generators[i]) for i in range(batch)]))
            figures = step_figures(chain, tokens, top_n)
            for row in list(active):
                yield row, emitters[row].emit(figures[row])
                if emitters[row].reason:
                    active.remove(row)
                    yield row, stats[row].summary(emitters[row].reason)
            if active:  # finished rows keep a place in the batch; their tokens are ignored
                history = history.advanced(tokens)
                logits = runner.step(tokens)


def run_to_end(events: Iterator[Any]) -> tuple[list[TokenEvent], Summary]:
    """Collect a run (tests, metrics): the token events and the summary."""
    tokens: list[TokenEvent] = []
    for item in events:
        if isinstance(item, Summary):
            return tokens, item
        tokens.append(item)
    raise RuntimeError("the token loop ended without a summary")
