"""Many requests decoded together (continuous batching): up to ``batch_size`` rows advance one
token per forward pass; a row that finishes leaves at once and the next request takes its place
(its prompt prefilled and merged in), so the batch stays full while the queue lasts. A model
loaded with ``--compile`` decodes in waves instead (:mod:`llmsample.engine.static`): a static
cache cannot take a row mid-run.

Every row keeps its own settings, seed, stop strings and length, and yields the same per-token
records as :func:`llmsample.engine.loop.generate`: each row draws from its own generator with
the pipeline's own functions, so in float32 a request gives the tokens it gives alone. The loop
itself is :func:`llmsample.engine.decode.decode`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from llmsample.engine.decode import DecodeOptions, decode
from llmsample.engine.prompt_cache import PromptCache
from llmsample.engine.row_state import BatchItem, RowFailed
from llmsample.events import Summary, TokenEvent
from llmsample.models.loading import LoadedModel

__all__ = ["BatchItem", "RowFailed", "decode_batch", "default_batch_size"]


def decode_batch(
    lm: LoadedModel,
    items: Iterable[BatchItem],
    batch_size: int,
    *,
    top_n: int = 5,
    ignore_eos: bool = False,
    watch: Sequence[tuple[str, int]] = (),
    reference: LoadedModel | None = None,
    on_forward: Callable[[float], None] | None = None,
    prompt_cache: PromptCache | None = None,
) -> Iterator[tuple[Any, TokenEvent | Summary | RowFailed]]:
    """Yields ``(key, event)`` per token, then ``(key, summary)`` or ``(key, RowFailed)`` when a
    request ends; requests end in whatever order they finish. ``watch``: as for
    :func:`llmsample.engine.loop.generate`, the same for every request; an item with a drafter
    speculates, its drafts verified in the same pass as every other row's. ``prompt_cache``: rows
    start from the prefixes earlier and running rows hold (:mod:`llmsample.engine.prompt_cache`)."""
    options = DecodeOptions(top_n, ignore_eos, watch, reference, on_forward=on_forward, prompt_cache=prompt_cache)
    yield from decode(lm, items, batch_size, options)


def default_batch_size(lm: LoadedModel, positions: int) -> int:
    """As many rows as a quarter of the free memory holds in KV cache for ``positions`` each, at
    most 64 on an accelerator and 16 on a CPU (where a wider step stops paying: docs/history/)."""
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
