"""Many requests decoded together (continuous batching): up to ``batch_size`` rows advance one
token per forward pass; a row that finishes leaves at once and the next request takes its place
(its prompt prefilled and merged in), so the batch stays full while the queue lasts.

Every row keeps its own settings, seed, stop strings and length, and yields the same per-token
records as :func:`llmsample.engine.loop.generate`: each row draws from its own generator with
the pipeline's own functions, so in float32 a request gives the tokens it gives alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.emitter import Emitter
from llmsample.engine.padded import PaddedBatch
from llmsample.errors import RuntimeFailure
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.figures import WatchIndex, step_figures
from llmsample.sampling.history import TokenHistory
from llmsample.sampling.pipeline import make_generator, sampler_chain


@dataclass(frozen=True)
class BatchItem:
    """One request as the engine sees it: ``key`` is the caller's, handed back with each record."""

    key: Any
    prompt_ids: list[int]
    cfg: SamplingConfig  # with its seed set
    stats: RunStats


@dataclass(frozen=True)
class RowFailed:
    """A request that failed while decoding (e.g. NaN logits): the others go on."""

    key: Any
    message: str


@dataclass
class _Row:
    item: BatchItem
    emitter: Emitter
    generator: torch.Generator
    history: TokenHistory


def decode_batch(
    lm: LoadedModel,
    items: Iterable[BatchItem],
    batch_size: int,
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
) -> Iterator[tuple[Any, TokenEvent | Summary | RowFailed]]:
    """Yields ``(key, event)`` per token, then ``(key, summary)`` or ``(key, RowFailed)`` when a
    request ends; requests end in whatever order they finish. ``watch``: as for
    :func:`llmsample.engine.loop.generate`, the same for every request."""
    names = [name for name, _ in watch]
    watched = WatchIndex.of([token for _, token in watch], lm.device)
    queue = iter(items)
    batch = PaddedBatch(lm.model)
    rows: list[_Row] = []
    logits = torch.zeros(0, lm.model.config.vocab_size, device=lm.sample_device)
    while True:
        joining = [item for _, item in zip(range(batch_size - len(rows)), queue, strict=False)]
        if joining:
            logits = torch.cat([logits, batch.admit([item.prompt_ids for item in joining])])
            rows += [_start_row(lm, item, logits.shape[-1], ignore_eos, names) for item in joining]
        if not rows:
            return
        tokens, outcomes, ids = yield from _sample(rows, logits, top_n, watched)
        staying = [i for i, finished in enumerate(outcomes) if not finished]
        if len(staying) < len(rows):
            batch.keep(staying)
            rows, tokens, ids = [rows[i] for i in staying], tokens[staying], [ids[i] for i in staying]
        if rows:
            for row, token, token_id in zip(rows, tokens, ids, strict=True):
                row.history = row.history.advanced(token.view(1), [token_id])
            logits = batch.step(tokens)
        else:
            logits = logits[:0]


def _start_row(lm: LoadedModel, item: BatchItem, vocab: int, ignore_eos: bool, watch_names: list[str]) -> _Row:
    prompt = torch.tensor([item.prompt_ids], device=lm.device)
    return _Row(
        item=item,
        emitter=Emitter(lm, item.cfg, item.stats, prompt, ignore_eos, watch_names),
        generator=make_generator(item.cfg.seed, lm.sample_device),
        history=TokenHistory.for_config(prompt, vocab, item.cfg, lm.tokenizer, lm.eos_ids),
    )


def _sample(
    rows: list[_Row], logits: Tensor, top_n: int, watched: WatchIndex | None
) -> Iterator[tuple[Any, TokenEvent | Summary | RowFailed]]:
    """One token for every row, rows that share settings through one chain (and one transfer);
    returns the tokens, per row whether it finished, and the token ids on the host."""
    tokens = torch.zeros(len(rows), dtype=torch.long, device=logits.device)
    finished = [False] * len(rows)
    ids = [0] * len(rows)
    groups: dict[SamplingConfig, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.item.cfg, []).append(i)
    for cfg, members in groups.items():
        whole = len(members) == len(rows)  # one setting for all (the common case): no row copies
        index = None if whole else torch.tensor(members, device=logits.device)
        history = _stack([rows[i].history for i in members])
        chain = sampler_chain(logits if index is None else logits[index], history, cfg)
        drawn = chain.draw([rows[i].generator for i in members])
        if index is None:
            tokens = drawn
        else:
            tokens[index] = drawn
        for i, figures in zip(members, step_figures(chain, drawn, top_n, watched), strict=True):
            row = rows[i]
            ids[i] = figures.token_id
            try:
                yield row.item.key, row.emitter.emit(figures)
            except RuntimeFailure as exc:  # this request's numbers broke, not the run
                finished[i] = True
                yield row.item.key, RowFailed(row.item.key, str(exc))
                continue
            if row.emitter.reason:
                finished[i] = True
                yield row.item.key, row.item.stats.summary(row.emitter.reason)
    return tokens, finished, ids


def _stack(histories: list[TokenHistory]) -> TokenHistory:
    """One history for rows that are sampled together (inert when their settings have no penalties)."""
    return TokenHistory.stack(histories)


def default_batch_size(lm: LoadedModel, positions: int) -> int:
    """As many rows as a quarter of the free memory holds in KV cache for ``positions`` each, at
    most 64 on an accelerator and 16 on a CPU (where a wider step stops paying: bench/NOTES.md)."""
    config = lm.model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_row = 2 * config.num_hidden_layers * heads * head_dim * positions * lm.dtype.itemsize
    if lm.device.type == "cuda":
        free = torch.cuda.mem_get_info(lm.device)[0]
        cap = 64
    else:
        free = _available_ram()
        cap = 16
    return max(1, min(cap, free // 4 // max(per_row, 1)))


def _available_ram() -> int:
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: assume little
        return 2**30
