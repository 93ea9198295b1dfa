"""Speculation that learns across requests (``--draft suffix``): one pool of the token sequences
of earlier and running requests (prompts and outputs), shared by every row of a server or a
batch run, proposes what followed the latest occurrence of a row's last n tokens, longest n
first (llama.cpp's ``ngram-mod`` shared hash pool, vLLM's suffix decoding, arXiv 2411.04975).
Requests that edit the same code or emit the same JSON shape draft each other's answers.

Each row also looks up its own sequence (prompt lookup, :class:`llmsample.engine.speculative.NgramDrafter`)
and the longer proposal wins. A proposal is a function of what is known before the pass's own
draws (the token sequences, and how much of the drafts of passes already verified the target
kept), so q is one-hot and the rejection step keeps every sampler exact, as for the prompt-lookup
drafter. The pool is bounded: past ``max_tokens`` stored tokens the oldest sequences go. A
sampled row's drafts, and so its draws, depend on the other rows through the pool: its seed
gives the same text with the same requests, not in any batch."""

from __future__ import annotations

from collections import Counter, OrderedDict

import torch
from torch import Tensor

from llmsample.engine.speculative import NgramDrafter
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Matcher
from llmsample.sampling.history import TokenHistory

POOL_TOKENS = 1 << 20
"""Tokens the pool holds by default (its index: a few entries per token; ~100 MB in Python at most)."""


MIN_PROB = 0.6
"""A draft goes on while the pool's estimate that the target accepts all of it so far stays at
least this. A drafted position is not free on a CPU: the default model (llama.cpp F16, 2
cores) is compute-bound, each position costing ~6.5 ms beside a 4-row pass of ~36 ms (9 ms a
token), so at batch 4 a position pays only when it is accepted well over half the time
(bench/NOTES.md, 2026-12-04)."""

BREAK_EVEN = 0.55
"""A drafted position pays only when the target accepts it more often than this: on the default
model (llama.cpp F16, 2 cores) one drafted position costs ~8 ms beside a one-row pass of ~15 ms
(bench/NOTES.md, 2026-12-04 23:20). Open chat's drafts, cut at :data:`MIN_PROB`, were accepted
47 % of the time there, repeated JSON records' 79 %."""

SURE = 0.9
"""While the pool's drafts are accepted less often than :data:`BREAK_EVEN`, a draft goes on only
while the pool's estimate stays at least this; those drafts keep measuring the acceptance."""

EVIDENCE = 16
"""Drafted positions measured (as weighed by :data:`WINDOW`) before the acceptance moves the cut."""

WINDOW = 256
"""Proposals the acceptance is measured over: at each, both counts lose 1/WINDOW of their weight,
so old evidence fades, and a cut that rose falls back to probe again once the drafts it let
through are too few to count."""

MAX_SPEC_FACTOR = 1.0
"""A draft is at most this times the length of the match it follows (SuffixDecoding's alpha)."""

MATCH_MAX = 32
"""The longest match measured (tokens compared backwards from an indexed n-gram)."""


class SuffixPool:
    """Sequences by id (oldest first), an index from each n-gram (``ngram_min``..``ngram_max``
    tokens) to where it last ended, ``(sequence id, position after it)``, and how often each
    n-gram (up to ``ngram_max + 1`` tokens) occurs in the pool. An index entry whose sequence
    left the pool is skipped, and the index is rebuilt once it holds far more entries than the
    pool's n-grams.

    A proposal follows SuffixDecoding (arXiv 2411.04975): what followed the latest occurrence of
    the longest match, cut where the estimated chance that all of it is accepted (the product of
    each token's frequency after its context, :meth:`confident`) falls below ``min_prob``, and at
    ``MAX_SPEC_FACTOR`` times the match's length. The cut rises to :data:`SURE` while the target
    accepts its rows' drafts (the pool's and their own lookup's, :meth:`scored`) less often than
    ``break_even``, one rate for the whole pool: where little repeats (open chat) the estimate is
    optimistic, and a rejected position costs more than an accepted one saves."""

    def __init__(
        self,
        ngram_min: int = 2,
        ngram_max: int = 6,
        max_tokens: int = POOL_TOKENS,
        min_prob: float = MIN_PROB,
        break_even: float = BREAK_EVEN,
    ) -> None:
        self.ngram_min, self.ngram_max, self.max_tokens = ngram_min, ngram_max, max_tokens
        self.min_prob, self.break_even = min_prob, break_even
        self.drafted, self.accepted = 0.0, 0.0
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}
        self.counts: Counter[tuple[int, ...]] = Counter()
        self.tokens = 0
        self._ids = 0

    def open(self) -> int:
        """A new sequence (a row that starts); its id."""
        self._ids += 1
        self.sequences[self._ids] = []
        return self._ids

    def extend(self, sid: int, seq: list[int], upto: int) -> None:
        """Sequence ``sid`` grows to ``seq[:upto]`` (``seq`` starts with what it holds); every n-gram
        ending in the new part is indexed and counted. A sequence evicted meanwhile is not taken back."""
        held = self.sequences.get(sid)
        if held is None:
            return
        start = len(held)
        held += seq[start:upto]
        self.tokens += len(held) - start
        for end in range(max(start, self.ngram_min), len(held) + 1):  # an n-gram ending just before ``end``
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.index[tuple(held[end - n : end])] = (sid, end)
        self._count(held, start, 1)
        self._evict(keep=sid)

    def lookup(self, seq: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest occurrence of ``seq``'s last n tokens
        anywhere in the pool (longest n first), as far as the pool is confident of them."""
        for n in range(min(self.ngram_max, len(seq)), self.ngram_min - 1, -1):
            found = self.index.get(tuple(seq[-n:]))
            if found is None:
                continue
            held = self.sequences.get(found[0])
            if held is not None and found[1] < len(held):
                match = _match_length(seq, held, found[1], n)
                return self.confident(seq, held[found[1] : found[1] + min(k, int(MAX_SPEC_FACTOR * match))])
        return []

    def scored(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens was verified and its first ``accepted`` kept."""
        self.drafted += drafted
        self.accepted += accepted

    def faded(self) -> None:
        """A proposal is made: the evidence so far weighs 1/WINDOW less."""
        self.drafted *= 1 - 1 / WINDOW
        self.accepted *= 1 - 1 / WINDOW

    def floor(self) -> float:
        """The joint chance a draft must keep: ``min_prob``, or :data:`SURE` while the drafts
        measured (:data:`EVIDENCE` positions at least) are accepted less often than ``break_even``."""
        paying = self.drafted < EVIDENCE or self.accepted >= self.break_even * self.drafted
        return self.min_prob if paying else max(self.min_prob, SURE)

    def confident(self, seq: list[int], continuation: list[int]) -> list[int]:
        """The first tokens of ``continuation`` (after ``seq``) whose joint chance, as the pool's
        counts estimate it, is at least :meth:`floor`: each token's share of what followed its
        longest context seen twice or more (a context seen once is no evidence)."""
        counts, low, floor = self.counts, max(self.ngram_min - 1, 1), self.floor()
        context, chance = list(seq[-self.ngram_max :]), 1.0
        for at, token in enumerate(continuation):
            lengths = range(min(self.ngram_max, len(context)), low - 1, -1)
            seen = next((key for n in lengths if counts[key := tuple(context[len(context) - n :])] >= 2), None)
            chance *= counts[(*seen, token)] / counts[seen] if seen is not None else 0.0
            if chance < floor:
                return continuation[:at]
            context = [*context[1:], token] if len(context) == self.ngram_max else [*context, token]
        return continuation

    def _count(self, held: list[int], start: int, sign: int) -> None:
        """Count (``sign`` 1) or forget (-1) the n-grams of ``held`` that end after ``start``
        (contexts of ``ngram_min - 1`` tokens and more, and each with the token after it)."""
        counts, low = self.counts, max(self.ngram_min - 1, 1)
        for end in range(start + 1, len(held) + 1):
            for n in range(low, min(self.ngram_max + 1, end) + 1):
                counts[tuple(held[end - n : end])] += sign

    def _evict(self, keep: int) -> None:
        while self.tokens > self.max_tokens and len(self.sequences) > 1:
            sid = next(iter(self.sequences))
            if sid == keep:
                self.sequences.move_to_end(sid)
                continue
            gone = self.sequences.pop(sid)
            self.tokens -= len(gone)
            self._count(gone, 0, -1)
        if len(self.index) > 4 * (self.ngram_max - self.ngram_min + 1) * max(self.tokens, 1024):
            self.index = {key: where for key, where in self.index.items() if where[0] in self.sequences}
            self.counts = +self.counts  # the n-grams no sequence holds any more


def _match_length(seq: list[int], held: list[int], end: int, n: int) -> int:
    """How many tokens before ``end`` in ``held`` equal ``seq``'s last ones (``n`` known, at most
    :data:`MATCH_MAX`)."""
    while n < MATCH_MAX and n < end and n < len(seq) and held[end - n - 1] == seq[-n - 1]:
        n += 1
    return n


class SuffixDrafter:
    """One row's drafter over the shared pool: its sequence joins the pool as it grows. ``own``:
    the row's prompt lookup (a drafter of its own, which indexes the row's tokens)."""

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
        self.pool.faded()
        pooled, own = self.pool.lookup(seq, k), self.pool.confident(seq, self.own.lookup(seq, k))
        best = pooled if len(pooled) >= len(own) else own
        self.pool.extend(self.sid, seq, len(seq))
        drafted = torch.tensor(best, dtype=torch.long, device=self.own.device)
        return drafted, torch.nn.functional.one_hot(drafted, self.own.vocab_size).float()

    def finished(self, seq: list[int]) -> None:
        """The row ended: its last tokens, emitted after its last proposal, join the pool too."""
        self.pool.extend(self.sid, seq, len(seq))

    def verified(self, drafted: int, accepted: int) -> None:
        """The target kept ``accepted`` of the row's last ``drafted``: the pool's acceptance."""
        self.pool.scored(drafted, accepted)
