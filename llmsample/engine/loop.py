"""Our own autoregressive loop: prefill once, one cached forward pass per token, one event
per token, then a summary."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor

from llmsample.engine.emitter import Emitter
from llmsample.engine.runner import ModelRunner
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import WatchIndex, step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain


def generate(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: RunStats,
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
    reference: LoadedModel | None = None,
) -> Iterator[TokenEvent | Summary]:
    """Sample up to ``cfg.max_tokens`` tokens; stop at EOS, a stop string or the length.

    ``stats`` belongs to the caller so that an interrupted run still has its summary; ``watch``:
    ``(name, token id)`` pairs whose numbers every event carries under ``name``; ``reference``:
    score every token under this model too (``--reference``)."""
    rows = generate_rows(
        lm, prompt_ids, cfg, [stats], [cfg.seed], top_n=top_n, ignore_eos=ignore_eos, watch=watch, reference=reference
    )
    for _, item in rows:
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
    watch: Sequence[tuple[str, int]] = (),
    reference: LoadedModel | None = None,
) -> Iterator[tuple[int, TokenEvent | Summary]]:
    """Several samples of one prompt advancing together, one forward pass per step; row i draws
    with its own generator seeded ``seeds[i]``, so it equals the same sample run alone.
    Yields ``(row, event)`` and ``(row, summary)`` when that row ends. Draws happen on
    ``lm.sample_device`` whatever devices the layers sit on."""
    from llmsample.engine.reference import ReferenceScorer

    batch = len(stats)
    length = prompt_ids.shape[1] + cfg.max_tokens
    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(ModelRunner.for_run(lm, batch, length))
        scorer = stack.enter_context(ReferenceScorer(reference, batch, length)) if reference is not None else None
        for row_stats in stats:
            if runner.compile_s:
                row_stats.extra["compile_s"] = runner.compile_s
        generators = [make_generator(seed, lm.sample_device) for seed in seeds]
        names = [name for name, _ in watch]
        emitters = [Emitter(lm, cfg, row_stats, prompt_ids, ignore_eos, names) for row_stats in stats]
        watched = WatchIndex.of([token for _, token in watch], lm.sample_device)
        ids = prompt_ids.expand(batch, -1)  # the same prompt in every row: no padding needed
        logits = runner.prefill(ids)
        if scorer is not None:
            scorer.start(ids)
        history = TokenHistory.for_config(ids, logits.shape[-1], cfg, lm.tokenizer, lm.eos_ids)
        active = list(range(batch))
        while active:
            chain = sampler_chain(logits, history, cfg)
            tokens = runner.agree(chain.draw(generators))
            figures = step_figures(chain, tokens, top_n, watched)
            scored = scorer.score(chain.raw, tokens) if scorer is not None else None
            for row in list(active):
                event = emitters[row].emit(figures[row])
                if scorer is not None and scored is not None:
                    event = dataclasses.replace(event, reference=scored[row])
                    scorer.totals[row].add(scored[row])
                    stats[row].extra["reference"] = scorer.totals[row].as_dict()
                yield row, event
                if emitters[row].reason:
                    active.remove(row)
                    yield row, stats[row].summary(emitters[row].reason)
            if active:  # finished rows keep a place in the batch; their tokens are ignored
                history = history.advanced(tokens, [f.token_id for f in figures])
                logits = runner.step(tokens)
                if scorer is not None:
                    scorer.advance(tokens)


def run_to_end(events: Iterator[Any]) -> tuple[list[TokenEvent], Summary]:
    """Collect a run (tests, metrics): the token events and the summary."""
    tokens: list[TokenEvent] = []
    for item in events:
        if isinstance(item, Summary):
            return tokens, item
        tokens.append(item)
    raise RuntimeError("the token loop ended without a summary")
