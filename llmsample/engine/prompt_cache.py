"""A prompt cache across requests (llama-server's ``cache_prompt``, vLLM's automatic prefix
caching, mlx-lm's LRU prompt cache): rows that leave the batch keep a copy of their cache here,
within a memory budget (least recently used out first), and a request whose prompt starts with
what a kept row or a running row holds starts from a copy of that prefix and prefills only the
rest. A chat client resends the whole conversation every turn; a batch's requests share a
system prompt: both prefill it once.

:class:`CachingBackend` does it on the seam (:mod:`llmsample.engine.backend`) for any backend
that can ``save`` a row's prefix and ``admit_saved`` from one (the padded batch: a copy of the
row's keys and values; llama.cpp: the sequence's state in host memory): it follows
every row's cached tokens through ``admit``, ``step``, ``verify`` and ``rollback``, so it knows
exactly what each row's cache holds when it leaves, and the loop does not change."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from llmsample.errors import NoRoom

MIN_REUSE = 4
"""Shorter shared prefixes are prefilled with the other prompts (one batched pass) rather than
copied (a pass of its own for the row)."""

MAX_ENTRIES = 1024
"""Kept rows at most, whatever their size (a lookup compares a prompt with those sharing its start)."""


class Saved(Protocol):
    """A copy of a row's first positions in memory of its own, owned by the cache (it outlives
    the backend it came from): its size, and how to let it go."""

    nbytes: int

    def release(self) -> None: ...


class Prefixes(Protocol):
    """What a backend offers the prompt cache (beside :class:`llmsample.engine.backend.Backend`)."""

    def save(self, row: int, length: int) -> Saved:
        """A copy of row ``row``'s first ``length`` cached positions, that outlives the row."""
        ...

    def admit_saved(self, saved: Saved, length: int, rest: list[int]) -> Tensor:
        """A new last row holding ``saved``'s first ``length`` positions and then ``rest``
        (prefilled); its next-token logits ``[1, vocab]``."""
        ...


@dataclass
class Entry:
    tokens: list[int]
    saved: Saved


class PromptCache:
    """Rows' caches kept after they left, least recently used first out once they pass
    ``budget_bytes`` (or ``MAX_ENTRIES``); lives as long as the server or the batch run (across
    its backends: every entry is memory of its own).
    Entries are found by their first ``MIN_REUSE`` tokens, so a lookup compares a prompt with
    the entries that could serve it only."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.buckets: dict[tuple[int, ...], set[int]] = {}
        self.used = 0
        self._ids = 0

    def _bucket(self, tokens: list[int]) -> set[int]:
        return self.buckets.get(tuple(tokens[:MIN_REUSE]), set()) if len(tokens) >= MIN_REUSE else set()

    def longest(self, prompt: list[int], touch: bool = True) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix (``MIN_REUSE`` tokens at least) with ``prompt``
        and that length (0: none); ``touch``: the entry counts as used (the last out)."""
        best, length, best_key = None, 0, 0
        for key in self._bucket(prompt):
            n = shared_prefix(self.entries[key].tokens, prompt)
            if n > length:
                best, length, best_key = self.entries[key], n, key
        if best is not None and touch:
            self.entries.move_to_end(best_key)
        return best, length

    def keeps(self, tokens: list[int]) -> bool:
        """Whether an entry already holds ``tokens`` (or more after them)."""
        held = (self.entries[key].tokens for key in self._bucket(tokens))
        return any(len(t) >= len(tokens) and t[: len(tokens)] == tokens for t in held)

    def put(self, tokens: list[int], saved: Saved) -> None:
        """Keep ``saved`` (holding ``tokens``, ``MIN_REUSE`` at least); entries it extends go, then
        the oldest while over budget."""
        if saved.nbytes > self.budget or len(tokens) < MIN_REUSE:
            saved.release()
            return
        for key in [k for k in self._bucket(tokens) if tokens[: len(self.entries[k].tokens)] == self.entries[k].tokens]:
            self._drop(key)
        self._ids += 1
        self.entries[self._ids] = Entry(list(tokens), saved)
        self.buckets.setdefault(tuple(tokens[:MIN_REUSE]), set()).add(self._ids)
        self.used += saved.nbytes
        while self.used > self.budget or len(self.entries) > MAX_ENTRIES:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        bucket = self.buckets[tuple(entry.tokens[:MIN_REUSE])]
        bucket.discard(key)
        if not bucket:
            del self.buckets[tuple(entry.tokens[:MIN_REUSE])]
        self.used -= entry.saved.nbytes
        entry.saved.release()


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CachingBackend:
    """A backend that admits prompts from the prompt cache where it can (through the wrapped
    backend's ``prefixes``); ``reused`` says, for the prompts of the last ``admit``, how many
    tokens each took from it. It joins rows in the running rows' pass where the wrapped backend
    does (each from its cached prefix, the rest prefilled in that pass), unless two of them share
    a prefix worth reusing."""

    prefixes = layers = None  # its rows' prefixes are the cache's to keep

    def __init__(self, backend: Any, cache: PromptCache) -> None:
        self.backend, self.cache = backend, cache
        self.kept: Prefixes = backend.prefixes
        self.sample_device: torch.device = backend.sample_device
        self.tokens: list[list[int]] = []  # what each row's cache holds
        self.reused: list[int] = []
        self.joining: CachingBackend | None = self if backend.joining is not None else None

    @property
    def can_join(self) -> bool:
        return self.backend.can_join

    @property
    def ragged(self) -> bool:
        return self.backend.ragged

    @property
    def splits_ragged(self) -> bool:
        return self.backend.splits_ragged

    @property
    def compile_s(self) -> float:
        return self.backend.compile_s

    def admit(self, prompts: list[list[int]], whole: Collection[int] = ()) -> Tensor:
        """Prompts with no prefix to share prefilled together; then each of the others from its
        longest source (a kept entry, a running row, a prompt of this call admitted before it);
        rows and logits in ``prompts``' order. ``whole``: the indices of prompts prefilled with
        the cold ones whatever the cache holds (``BatchItem.cache_prompt`` False). Where the
        backend joins rows from kept prefixes, in two passes at most (:meth:`_admit_in_waves`)."""
        start = len(self.tokens)
        try:
            if self.joining is not None:
                order, logits, reused = self._admit_in_waves(prompts, whole)
            else:
                order, logits, reused = self._admit_one_by_one(prompts, whole)
        except NoRoom:  # the rows a first pass admitted go too: the loop holds them all back
            self.backend.keep(list(range(start)))
            del self.tokens[start:]
            raise
        if order != sorted(order):  # the backend's new rows hold the prompts in ``order``
            rank = [order.index(i) for i in range(len(prompts))]
            self.backend.keep([*range(start), *(start + r for r in rank)])
            self.tokens[start:] = [self.tokens[start + r] for r in rank]
            logits = logits[torch.tensor(rank, device=logits.device)]
        self.reused = [reused[i] for i in range(len(prompts))]
        return logits

    def _admit_one_by_one(
        self, prompts: list[list[int]], whole: Collection[int]
    ) -> tuple[list[int], Tensor, dict[int, int]]:
        """The cold prompts in one pass, then each warm one in a pass of its own (``admit_saved``):
        the order of the new rows, their logits, and per prompt the tokens it reused."""
        cold, warm = [], []
        for i, prompt in enumerate(prompts):
            earlier = max((shared_prefix(prompts[j], prompt) for j in cold + warm), default=0)
            shares = i not in whole and max(earlier, self.cache.longest(prompt, touch=False)[1]) >= MIN_REUSE
            (warm if shares else cold).append(i)
        parts = [self.backend.admit([prompts[i] for i in cold])] if cold else []
        self.tokens += [list(prompts[i]) for i in cold]
        reused = dict.fromkeys(cold, 0)
        for i in warm:
            source, n = self._source(prompts[i])
            if source is None:
                parts.append(self.backend.admit([prompts[i]]))
            else:
                parts.append(self.kept.admit_saved(source[0], n, prompts[i][n:]))
                if source[1]:
                    source[0].release()
            self.tokens.append(list(prompts[i]))
            reused[i] = n
        return cold + warm, torch.cat(parts), reused

    def _admit_in_waves(
        self, prompts: list[list[int]], whole: Collection[int]
    ) -> tuple[list[int], Tensor, dict[int, int]]:
        """Every prompt whose longest source is there now (a kept entry, a running row) or that
        has none, in one pass, each from its source (:meth:`forward_joining`); then, in a second,
        those that share more with a prompt of the first: a pass's fixed cost is paid twice, not
        once a prompt (the 16 prompts of a server's busy moment share their first words). A
        prompt of the second pass whose longest prefix is another's of that pass starts from the
        first pass's rows instead."""
        waves: tuple[list[int], list[int]] = ([], [])
        for i, prompt in enumerate(prompts):
            earlier = max((shared_prefix(prompts[j], prompt) for j in range(i)), default=0)
            waves[int(i not in whole and earlier >= MIN_REUSE and earlier > self._held(prompt))].append(i)
        parts, reused = [], {}
        for wave in filter(None, waves):
            whole_here = {at for at, i in enumerate(wave) if i in whole}
            parts.append(self.forward_joining([[] for _ in self.tokens], [prompts[i] for i in wave], whole_here)[1])
            reused.update(zip(wave, self.reused, strict=True))
        return waves[0] + waves[1], torch.cat(parts), reused

    def _held(self, prompt: list[int]) -> int:
        """The longest prefix of ``prompt`` the cache or a running row holds now."""
        return max(self._running(prompt)[1], self.cache.longest(prompt, touch=False)[1])

    def _running(self, prompt: list[int]) -> tuple[int | None, int]:
        """The running row that shares the longest prefix with ``prompt``, and that length."""
        shared = [shared_prefix(held, prompt) for held in self.tokens]
        return (None, 0) if not shared else (max(range(len(shared)), key=shared.__getitem__), max(shared))

    def joins(self, prompts: list[list[int]], whole: Collection[int] = ()) -> bool:
        """Whether :meth:`forward_joining` takes ``prompts``: none shares a prefix worth reusing
        with another of them (:meth:`admit` prefills the first and copies it for the others)."""
        if self.backend.joining is None or not self.backend.joining.joins(prompts):
            return False
        return not any(
            i not in whole and max((shared_prefix(p, prompt) for p in prompts[:i]), default=0) >= MIN_REUSE
            for i, prompt in enumerate(prompts)
        )

    def forward_joining(
        self, fed: list[list[int]], prompts: list[list[int]], whole: Collection[int] = ()
    ) -> tuple[Tensor, Tensor]:
        """The backend's pass of ``fed`` with ``prompts`` joining (:meth:`joins` said yes), each
        from its longest cached prefix (a kept entry or a running row; the joining backend, a
        llama.cpp batch, writes it back first) and prefilling the rest in the same pass;
        ``whole``: the indices of prompts prefilled whole whatever is cached."""
        sources = [(None, 0) if i in whole else self._source(prompt) for i, prompt in enumerate(prompts)]
        kept = [None if source is None else (source[0], n) for source, n in sources]
        rests = [prompt[n:] for prompt, (_, n) in zip(prompts, sources, strict=True)]
        try:
            out = self.backend.joining.forward_joining(fed, rests, kept=kept)
        finally:
            for source, _ in sources:
                if source is not None and source[1]:
                    source[0].release()
        for held, tokens in zip(self.tokens, fed, strict=True):
            held += tokens
        self.tokens += [list(prompt) for prompt in prompts]
        self.reused = [n for _, n in sources]
        return out

    def _source(self, prompt: list[int]) -> tuple[tuple[Saved, bool] | None, int]:
        """Where ``prompt``'s longest cached prefix is (a kept entry, or a running row copied for
        the occasion: temporary) and its length, at most all but the last token (its logits are
        needed); ``(None, 0)`` when none is worth a pass of its own."""
        entry, length = self.cache.longest(prompt)
        running, live = self._running(prompt)
        length, live = min(length, len(prompt) - 1), min(live, len(prompt) - 1)
        if max(length, live) < MIN_REUSE:
            return None, 0
        if live > length and running is not None:
            return (self.kept.save(running, live), True), live
        assert entry is not None
        return (entry.saved, False), length

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        logits = self.backend.admit_copies(prompt, copies)
        self.tokens += [list(prompt) for _ in range(copies)]
        self.reused = [0] * copies
        return logits

    def step(self, tokens: Tensor) -> Tensor:
        logits = self.backend.step(tokens)
        for held, token in zip(self.tokens, tokens.view(-1).tolist(), strict=True):
            held.append(token)
        return logits

    def verify(self, tokens: list[list[int]]) -> Tensor:
        logits = self.backend.verify(tokens)
        for held, fed in zip(self.tokens, tokens, strict=True):
            held += fed
        return logits

    def rollback(self, row: int, length: int) -> None:
        self.backend.rollback(row, length)
        del self.tokens[row][length:]

    def keep(self, rows: list[int]) -> None:
        """Rows that leave are kept in the cache first (unless it holds them already)."""
        kept = set(rows)
        for r, held in enumerate(self.tokens):
            if r not in kept and len(held) >= MIN_REUSE and not self.cache.keeps(held):
                self.cache.put(held, self.kept.save(r, len(held)))
        self.backend.keep(rows)
        self.tokens = [self.tokens[r] for r in rows]

    def agree(self, tokens: Tensor) -> Tensor:
        return self.backend.agree(tokens)

    def close(self) -> None:
        self.backend.close()


def with_prompt_cache(backend: Any, cache: PromptCache | None) -> Any:
    """``backend`` admitting prompts from ``cache`` where it keeps prefixes (its ``prefixes``);
    as it is without a cache, or where it keeps none."""
    if cache is None or backend.prefixes is None:
        return backend
    return CachingBackend(backend, cache)
