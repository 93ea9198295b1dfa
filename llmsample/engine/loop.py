"""One prompt through the engine: ``generate`` (one row), ``speculative_generate`` (one row with a
drafter) and several samples of it advancing together (``compare-presets``), all on
:func:`llmsample.engine.decode.decode`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.errors import RuntimeFailure, UserError
from llmsample.events import RunStats, Summary, TokenEvent
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig

if TYPE_CHECKING:
    from llmsample.engine.speculative import Drafter


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
    score every token under this model too (``--reference``). Broken numbers raise
    :class:`RuntimeFailure` naming the position."""
    options = DecodeOptions(top_n, ignore_eos, watch, reference)
    yield from _one_row(lm, BatchItem(0, prompt_ids[0].tolist(), cfg, stats), options)


def _one_row(lm: LoadedModel, item: BatchItem, options: DecodeOptions) -> Iterator[TokenEvent | Summary]:
    for _, record in decode(lm, [item], 1, options, one_prompt=True):
        if isinstance(record, RowFailed):
            raise (UserError if record.user_error else RuntimeFailure)(record.message)
        yield record


def speculative_generate(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: RunStats,
    drafter: Drafter,
    *,
    draft_tokens: int | None = None,
    top_n: int = 5,
    ignore_eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
    reference: LoadedModel | None = None,
) -> Iterator[TokenEvent | Summary]:
    """The same events as :func:`llmsample.engine.loop.generate`, each tagged with its source:
    one row with a drafter through the one loop."""
    item = BatchItem(0, prompt_ids[0].tolist(), cfg, stats, lambda: drafter, draft_tokens)
    yield from _one_row(lm, item, DecodeOptions(top_n, ignore_eos, watch, reference))


def generate_rows(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    stats: list[RunStats],
    seeds: list[int | None],
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
) -> Iterator[tuple[int, TokenEvent | Summary | RowFailed]]:
    """Several samples of one prompt advancing together (prefilled once); row i draws with its
    own generator seeded ``seeds[i]``, so it equals the same sample run alone. Yields
    ``(row, event)``, then ``(row, summary)`` or ``(row, RowFailed)`` when that row ends (a row
    whose numbers break ends alone)."""
    ids = prompt_ids[0].tolist()
    items = [
        BatchItem(row, ids, dataclasses.replace(cfg, seed=seed), row_stats)
        for row, (row_stats, seed) in enumerate(zip(stats, seeds, strict=True))
    ]
    yield from decode(lm, items, len(items), DecodeOptions(top_n, ignore_eos), one_prompt=True)


def run_to_end(events: Iterator[Any]) -> tuple[list[TokenEvent], Summary]:
    """Collect a run (tests, metrics): the token events and the summary."""
    tokens: list[TokenEvent] = []
    for item in events:
        if isinstance(item, Summary):
            return tokens, item
        tokens.append(item)
    raise RuntimeError("the token loop ended without a summary")
