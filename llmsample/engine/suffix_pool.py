"""Speculation that learns across requests (``--draft suffix``): one pool of the token sequences
of earlier and running requests (prompts and outputs), shared by every row of a server or a
batch run, proposes what followed the latest occurrence of a row's last n tokens, longest n
first (llama.cpp's ``ngram-mod`` shared hash pool, vLLM's suffix decoding, arXiv 2411.04975).
Requests that edit the same code or emit the same JSON shape draft each other's answers.

Each row also looks up its own sequence (prompt lookup, :class:`llmsample.engine.speculative.NgramDrafter`)
and the longer proposal wins. A proposal is a function of what is known before the pass's own
draws (the token sequences, how much of the drafts of passes already verified the target kept,
and the rows sharing the pass), so q is one-hot and the rejection step keeps every sampler
exact, as for the prompt-lookup drafter. The pool is bounded: past ``max_tokens`` stored tokens the oldest sequences go. A
sampled row's drafts, and so its draws, depend on the other rows through the pool: its seed
gives the same text with the same requests at the same batch size, not in any batch."""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from llmsample.engine.pass_cost import PassShape, best_length, machine_shape
from llmsample.engine.speculative import NgramDrafter
from llmsample.jobs import NGRAM
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.constraint import Matcher
from llmsample.sampling.history import TokenHistory

POOL_TOKENS = 1 << 20
"""Tokens the pool holds by default (its index: a few entries per token; ~100 MB in Python at most)."""


REACH = 0.2
"""A draft goes on while the chance that all of it is kept stays at least this, and in a pool that
prices its passes (:mod:`llmsample.engine.pass_cost`) its length is the one with the most tokens
for its pass's cost (:func:`best_length`): on the default model a drafted position past the first
costs about a fifth of a one-position pass or less, so a token kept less often than that pays
nowhere. It replaced a fixed floor (0.6, and more as rows joined): priced, the vs-llamacpp
workloads ran 0.94-1.28x as fast (docs/history/2026-12.md, 2026-12-07)."""

BINS = (0.5, 0.8, 0.95)
"""Edges of the pool's own estimate of a drafted token (its share of what followed its context):
the target's acceptance is measured in each bin, because the estimate is right where answers
repeat and optimistic where little does. On the default model, tokens the pool was 0.99 sure
of were kept 95 % of the time in repeated JSON records and 77 % in sampled open chat
(docs/history/2026-12.md, 2026-12-05)."""

PRIOR = 1.0
"""Drafted positions' worth of weight the pool's own estimate keeps in a bin's acceptance: with
nothing measured (or all of it faded) the estimate is taken as it is, and drafts probe again.
One position's worth: a heavier prior lets the drafts that do not pay through again as soon as
the evidence fades to a few positions (sampled open chat at batch 4 drafted three times as much
with 4, docs/history/2026-12.md, 2026-12-05)."""

WINDOW = 256
"""Proposals the acceptance is measured over: at each, every bin's counts lose 1/WINDOW of their
weight, so old evidence fades."""

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
    the longest match, cut at ``MAX_SPEC_FACTOR`` times the match's length and where the chance
    that all of it is accepted falls below ``min_prob`` (:meth:`confident`). That chance is the
    product of each token's frequency after its context, as the target has kept such tokens
    (:meth:`calibrated`): the pool measures how often the target accepts its rows' drafts (the
    pool's and their own lookup's, :meth:`scored`) by how sure it was of each token."""

    def __init__(
        self,
        ngram_min: int = 2,
        ngram_max: int = 6,
        max_tokens: int = POOL_TOKENS,
        min_prob: float = REACH,
        shape: PassShape | None = None,
    ) -> None:
        """``min_prob``: a draft stops where the chance that all of it is kept falls below this;
        ``shape``: what passes cost by width, a draft's length then the one that pays most
        (:meth:`confident`; None: as long as ``min_prob`` lets it go)."""
        self.ngram_min, self.ngram_max, self.max_tokens = ngram_min, ngram_max, max_tokens
        self.min_prob, self.shape = min_prob, shape
        self.tested = [0.0] * (len(BINS) + 1)  # drafted positions the target verified, by bin
        self.kept = [0.0] * (len(BINS) + 1)  # and those it accepted
        self.sequences: OrderedDict[int, list[int]] = OrderedDict()
        self.index: dict[tuple[int, ...], tuple[int, int]] = {}
        self.counts: Counter[tuple[int, ...]] = Counter()
        self.tokens = 0
        self._ids = 0

    def empty(self) -> SuffixPool:
        """A pool with these settings and nothing learned (a job's own: :attr:`llmsample.jobs.Job.own_pool`)."""
        return SuffixPool(self.ngram_min, self.ngram_max, self.max_tokens, self.min_prob, self.shape)

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

    def lookup(self, seq: list[int], k: int, rows: int = 1) -> tuple[list[int], list[float]]:
        """Up to ``k`` tokens that followed the latest occurrence of ``seq``'s last n tokens
        anywhere in the pool (longest n first), as far as the pool is confident of them for a
        pass of ``rows`` rows; and its estimate of each (:meth:`confident`)."""
        for n in range(min(self.ngram_max, len(seq)), self.ngram_min - 1, -1):
            found = self.index.get(tuple(seq[-n:]))
            if found is None:
                continue
            held = self.sequences.get(found[0])
            if held is not None and found[1] < len(held):
                match = _match_length(seq, held, found[1], n)
                return self.confident(seq, held[found[1] : found[1] + min(k, int(MAX_SPEC_FACTOR * match))], rows)
        return [], []

    def scored(self, chances: list[float], accepted: int) -> None:
        """A draft whose tokens the pool estimated at ``chances`` was verified and its first
        ``accepted`` kept: those, and the first rejected, count in their estimates' bins."""
        for at, chance in enumerate(chances[: accepted + 1]):
            b = bisect.bisect_right(BINS, chance)
            self.tested[b] += 1
            self.kept[b] += at < accepted

    def faded(self) -> None:
        """A proposal is made: the evidence so far weighs 1/WINDOW less."""
        keep = 1 - 1 / WINDOW
        self.tested = [n * keep for n in self.tested]
        self.kept = [n * keep for n in self.kept]

    def calibrated(self, chance: float) -> float:
        """How often the target keeps a token the pool estimates at ``chance`` (0 stays 0: a
        context the pool has seen once is no evidence)."""
        if chance <= 0:
            return 0.0
        b = bisect.bisect_right(BINS, chance)
        return (self.kept[b] + PRIOR * chance) / (self.tested[b] + PRIOR)

    def confident(self, seq: list[int], continuation: list[int], rows: int = 1) -> tuple[list[int], list[float]]:
        """The first tokens of ``continuation`` (after ``seq``) worth drafting for a pass of ``rows``
        rows, and the pool's estimate of each: its share of what followed the token's longest
        context seen twice or more in the pool. Each token's :meth:`calibrated` estimate multiplies
        into the chance that the target keeps all of the draft so far; the draft goes on while that
        stays at least ``min_prob``, and in a pool that prices its passes its length is then the
        one that makes the most tokens for the pass's cost
        (:func:`llmsample.engine.pass_cost.best_length`)."""
        counts, low = self.counts, max(self.ngram_min - 1, 1)
        context, joint, chances, joints = list(seq[-self.ngram_max :]), 1.0, [], []
        for token in continuation:
            lengths = range(min(self.ngram_max, len(context)), low - 1, -1)
            seen = next((key for n in lengths if counts[key := tuple(context[len(context) - n :])] >= 2), None)
            chance = counts[(*seen, token)] / counts[seen] if seen is not None else 0.0
            joint *= self.calibrated(chance)
            if joint < self.min_prob:
                break
            chances.append(chance)
            joints.append(joint)
            context = [*context[1:], token] if len(context) == self.ngram_max else [*context, token]
        if self.shape is not None:
            chances = chances[: best_length(joints, rows, self.shape)]
        return continuation[: len(chances)], chances

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

    drawn = False

    def __init__(self, pool: SuffixPool, own: NgramDrafter) -> None:
        self.pool, self.own = pool, own
        self.sid = pool.open()
        self.rows = 1  # the rows of the pass it drafts for next (:meth:`sharing`)
        self.chances: list[float] = []  # the pool's estimate of each token of its last proposal

    def sharing(self, rows: int) -> None:
        """The next proposal is for a pass of ``rows`` rows (the row says, before proposing)."""
        self.rows = rows

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
        pooled = self.pool.lookup(seq, k, self.rows)
        own = self.pool.confident(seq, self.own.lookup(seq, k), self.rows)
        best, self.chances = pooled if len(pooled[0]) >= len(own[0]) else own
        self.pool.extend(self.sid, seq, len(seq))
        drafted = torch.tensor(best, dtype=torch.long, device=self.own.device)
        return drafted, torch.nn.functional.one_hot(drafted, self.own.vocab_size).float()

    def finished(self, seq: list[int]) -> None:
        """The row ended: its last tokens, emitted after its last proposal, join the pool too."""
        self.pool.extend(self.sid, seq, len(seq))

    def verified(self, drafted: int, accepted: int) -> None:
        """The target kept ``accepted`` of the row's last ``drafted`` (its proposal, as the row
        cut it): the pool's acceptance."""
        self.pool.scored(self.chances[:drafted], accepted)


DRAFTING_BACKENDS = ("llama.cpp", "torch")
"""Where ``--draft auto`` drafts: llama.cpp (the default, where what a drafted position costs
was measured, :mod:`llmsample.engine.pass_cost`) and the torch forward. transformers' own forward (a reference
path, never the default) decodes one token a pass unless a drafter is asked for."""


@dataclass(frozen=True)
class PoolDrafters:
    """``--draft suffix``: a maker of one drafter per row over one pool, the run's (a server's:
    every request's); each row also looks up its own tokens (``ngram``: shortest, longest n)."""

    pool: SuffixPool
    vocab_size: int
    device: torch.device
    ngram: tuple[int, int]

    def __call__(self) -> SuffixDrafter:
        return SuffixDrafter(self.pool, NgramDrafter(self.vocab_size, self.device, *self.ngram))

    def fresh(self) -> PoolDrafters:
        """The same drafters over an empty pool: a job's own, as a ``generate`` process starts
        with (:attr:`llmsample.jobs.Job.own_pool`)."""
        return dataclasses.replace(self, pool=self.pool.empty())


def suffix_drafter(lm: LoadedModel, ngram: tuple[int, int] = NGRAM) -> PoolDrafters:
    """``--draft suffix`` for ``lm``: a fresh pool, its draft lengths priced by what passes cost on
    this machine (:mod:`llmsample.engine.pass_cost`)."""
    pool = SuffixPool(ngram[0], max(ngram[1], 6), shape=machine_shape())
    return PoolDrafters(pool, lm.model.config.vocab_size, lm.sample_device, ngram)


def auto_drafter(lm: LoadedModel, ngram: tuple[int, int] = NGRAM) -> PoolDrafters | None:
    """``--draft auto``, the default: the suffix pool and prompt lookup, which draft only what the
    pool expects the target to keep (:meth:`SuffixPool.confident`, from measured acceptance), so
    where drafts are rejected they stop, each draft as long as pays most for what passes cost;
    None on a backend that does not draft by default. A draft changes a pass's rounding on
    llama.cpp, so a job that must give ``generate``'s text for a seed (a chat exchange, which
    may be undone) drafts from a pool of its own (:meth:`PoolDrafters.fresh`)."""
    return suffix_drafter(lm, ngram) if lm.backend in DRAFTING_BACKENDS else None
