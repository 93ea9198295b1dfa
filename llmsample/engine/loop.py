"""One prompt through the engine: ``generate`` (one row, with a drafter or not) and several
samples of it advancing together (``generate_rows``), both on :func:`llmsample.engine.decode.decode`
(the commands run through :class:`~llmsample.api.local.LocalEngine`; these serve the tests and
the benchmarks that time the loop itself)."""

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
    drafter: Drafter | None = None,
    draft_tokens: int | None = None,
    top_n: int = 5,
    ignore_eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
    reference: LoadedModel | None = None,
) -> Iterator[TokenEvent | Summary]:
    """Sample up to ``cfg.max_tokens`` tokens; stop at EOS, a stop string or the length.

    ``stats`` belongs to the caller so that an interrupted run still has its summary;
    ``drafter``: speculate with it (each event tagged with its source; ``draft_tokens``: a
    fixed K, None adaptive); ``watch``: ``(name, token id)`` pairs whose numbers every event
    carries under ``name``; ``reference``: score every token under this model too
    (``--reference``). Broken numbers raise :class:`RuntimeFailure` naming the position."""
    drafts = None if drafter is None else (lambda: drafter)
    item = BatchItem(0, prompt_ids[0].tolist(), cfg, stats, drafts, draft_tokens, reference=reference is not None)
    for _, record in decode(lm, [item], 1, DecodeOptions(top_n, ignore_eos, watch, reference), one_prompt=True):
        if isinstance(record, RowFailed):
            raise (UserError if record.user_error else RuntimeFailure)(record.message)
        yield record


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
