"""Speculation that learns across requests (``--draft suffix``): one pool of the token sequences
of earlier and running requests (prompts and outputs), shared by every row of a server or a
batch run, proposes what followed the latest occurrence of a row's last n tokens, longest n
first (llama.cpp's ``ngram-mod`` shared hash pool, vLLM's suffix decoding, arXiv 2411.04975).
Requests that edit the same code or emit the same JSON shape draft each other's answers.

Each row also looks up its own sequence (prompt lookup, :class:`llmsample.engine.speculative.NgramDrafter`)
and the longer proposal wins. Proposals are a function of token sequences only, so q is one-hot
and the rejection step keeps every sampler exact, as for the prompt-lookup drafter. The pool is
bounded: past ``max_tokens`` stored tokens the oldest sequences go."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor

from llmsample.engine.speculative import NgramDrafter
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Matcher
from llmsample.sampling.history import TokenHistory

POOL_TOKENS = 1 << 20
"""Tokens the pool holds by default (its index: a few entries per token; ~100 MB in Python at most)."""


class SuffixPool:
    """Sequences by id (oldest first) and an index from each n-gram (``ngram_min``..``ngram_max``
    tokens) to where it last ended: ``(sequence id, position after it)``. An index entry whose
    sequence left the pool is skipped, and the index is rebuilt once it holds far more
    entries than the pool's n-grams."""

    def __init__(self, ngram_min: int = 2, ngram_max: int = 6, max_tokens: int = POOL_TOKENS) -> None:
        self.ngram_min, self.ngram_max, self.max_tokens = ngram_min, ngram_max, max_tokens
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}
        self.tokens = 0
        self._ids = 0

    def open(self) -> int:
        """A new sequence (a row that starts); its id."""
        self._ids += 1
        self.sequences[self._ids] = []
        return self._ids

    def extend(self, sid: int, seq: list[int], upto: int) -> None:
        """Sequence ``sid`` grows to ``seq[:upto]`` (``seq`` starts with what it holds); every n-gram
        ending in the new part is indexed. A sequence evicted meanwhile is not taken back."""
        held = self.sequences.get(sid)
        if held is None:
            return
        start = len(held)
        held += seq[start:upto]
        self.tokens += len(held) - start
        for end in range(max(start, self.ngram_min), len(held) + 1):  # an n-gram ending just before ``end``
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.index[tuple(held[end - n : end])] = (sid, end)
        self._evict(keep=sid)

    def lookup(self, seq: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest occurrence of ``seq``'s last n tokens
        anywhere in the pool, longest n first."""
        for n in range(min(self.ngram_max, len(seq)), self.ngram_min - 1, -1):
            found = self.index.get(tuple(seq[-n:]))
            if found is None:
                continue
            held = self.sequences.get(found[0])
            if held is not None and found[1] < len(held):
                return held[found[1] : found[1] + k]
        return []

    def _evict(self, keep: int) -> None:
        while self.tokens > self.max_tokens and len(self.sequences) > 1:
            sid = next(iter(self.sequences))
            if sid == keep:
                self.sequences.move_to_end(sid)
                continue
            self.tokens -= len(self.sequences.pop(sid))
        if len(self.index) > 4 * (self.ngram_max - self.ngram_min + 1) * max(self.tokens, 1024):
            self.index = {key: where for key, where in self.index.items() if where[0] in self.sequences}


class SuffixDrafter:
    """One row's drafter over the shared pool: its sequence joins the pool as it grows."""

    def __init__(self, pool: SuffixPool, own: NgramDrafter) -> None:
        self.pool, self.own = pool, own
        self.sid = pool.open()

    def propose(
        self,
        seq: list[int],
        k: int,
        history: TokenHistory,
        cfg: SamplingConfig,
        generator: torch.Generator,
        matcher: Matcher | None = None,
    ) -> tuple[Tensor, Tensor]:
        # The n-grams ending before the last token first: the last one's latest occurrence would
        # otherwise be the row's own end, with nothing after it.
        self.pool.extend(self.sid, seq, len(seq) - 1)
        pooled, own = self.pool.lookup(seq, k), self.own.lookup(seq, k)
        best = pooled if len(pooled) >= len(own) else own
        self.pool.extend(self.sid, seq, len(seq))
        drafted = torch.tensor(best, dtype=torch.long, device=self.own.device)
        return drafted, torch.nn.functional.one_hot(drafted, self.own.vocab_size).float()
