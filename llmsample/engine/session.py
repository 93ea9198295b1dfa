"""A conversation's cache kept between turns: one row of the engine whose backend outlives a
run. Each turn keeps the longest token prefix it shares with what is cached, rolls the row back
to it and prefills only the rest; undo, regenerate and branching are turns like any other."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from llmsample.engine.backend import Backend, open_backend
from llmsample.engine.decode import DecodeOptions, run_rows
from llmsample.engine.feed import IterableFeed
from llmsample.engine.row_state import BatchItem
from llmsample.engine.step import Record
from llmsample.events import CacheReuse
from llmsample.models.loading import LoadedModel


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def fed_from(prompt: list[int], cached: list[int]) -> int:
    """How much of ``prompt`` a turn takes from the cache: what they share, but two tokens at
    least are fed (one gives the next token's logits; a pass of one token is summed by another
    kernel than a prefill's on llama.cpp, so the prompt's last position would not be the number
    ``generate`` gets prefilling it whole: :func:`llmsample.engine.llamacpp_batch.passes`)."""
    return max(0, min(shared_prefix(prompt, cached), len(prompt) - 2))


class Session:
    """One row's KV cache across runs; ``cached`` is what it holds. Close it when done."""

    def __init__(self, lm: LoadedModel, positions: int, options: DecodeOptions | None = None) -> None:
        """``positions``: the longest conversation the cache must hold (a static cache's size)."""
        options = options or DecodeOptions()
        if options.reference is not None:
            raise ValueError("a session scores no reference")
        self.lm, self.options, self.positions = lm, options, positions
        self.backend: Backend | None = None
        self.cached: list[int] = []

    def turn(self, item: BatchItem) -> Iterator[Record]:
        """Decode ``item`` (the whole conversation so far as its prompt) on the cached row; its
        summary's ``cache`` section says how many prompt tokens were reused and prefilled."""
        prompt = item.prompt_ids
        reused = fed_from(prompt, self.cached)
        item.stats.note(cache=CacheReuse(reused=reused, prefilled=len(prompt) - reused))
        completed = False
        try:
            rows = yield from run_rows(
                self.lm, [self._backend()], IterableFeed([]), [item], 1, self.options, self._prefill, retain=True
            )
            completed = bool(rows) and rows[0].text.emitter.reason is not None
            if completed:
                row = rows[0]
                keep = min(row.cached, len(row.text.seq) - 1)
                if row.cached > keep:
                    self._backend().rollback(0, keep)
                self.cached = row.text.seq[:keep]
        finally:
            if not completed:  # interrupted or failed: what the cache holds is unknown, start afresh
                self.reset()

    def reset(self) -> None:
        """Forget the cache (the next turn prefills everything)."""
        if self.backend is not None:
            self.backend.close()
        self.backend, self.cached = None, []

    def close(self) -> None:
        self.reset()

    def _backend(self) -> Backend:
        if self.backend is None:
            self.backend = open_backend(self.lm, 1, self.positions, True, self.options.on_forward,
                                        deterministic=self.options.deterministic)
        return self.backend

    def _prefill(self, joining: list[BatchItem]) -> list[torch.Tensor]:
        (item,) = joining
        prompt, backend = item.prompt_ids, self._backend()
        if not self.cached:  # a fresh backend (a failed or interrupted turn reset it)
            self.cached = list(prompt)
            return [backend.admit([prompt])]
        reused = fed_from(prompt, self.cached)
        backend.rollback(0, reused)
        logits = backend.verify([prompt[reused:]])[:, len(prompt) - reused - 1]
        self.cached = list(prompt)
        return [logits]
