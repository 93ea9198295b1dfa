"""What the penalties and the text-aware stages look at: the tokens seen so far, per row."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.errors import UserError
from llmsample.sampling import carried as carried_stages
from llmsample.sampling.config import ConfigError, SamplingConfig
from llmsample.sampling.stages import needs_sequences, needs_vocabulary
from llmsample.sampling.vocabulary import Vocabulary, bias_vector


@dataclass(frozen=True)
class TokenHistory:
    """Counts of generated tokens and the set of tokens seen anywhere (prompt or generated), both
    ``[batch, vocab]``; or inert (both None) when no penalty is on, so the loops never branch.

    ``sequences`` (prompt + generated ids per row, on the host) and ``prompt_lengths`` are kept
    only for stages that read the order of tokens (DRY, bans, min-tokens); ``vocabulary`` only for
    stages that need the tokenizer. The loops hand the new ids over from the step's one transfer,
    so keeping them costs no device synchronisation.

    ``state``: the carried stages' per-row state ``[rows, 2]`` (:mod:`llmsample.sampling.carried`),
    replaced by the loop after each draw; ``carried``: per row, the token drawn since the row
    before it when the row continues it (:meth:`prefixes`), -1 when its state is its own."""

    counts: Tensor | None
    seen: Tensor | None
    sequences: tuple[tuple[int, ...], ...] | None = None
    prompt_lengths: tuple[int, ...] | None = None
    vocabulary: Vocabulary | None = None
    allowed: Tensor | None = None
    state: Tensor | None = None
    carried: tuple[int, ...] | None = None

    @classmethod
    def start(
        cls,
        prompt_ids: Tensor,
        vocab_size: int,
        track: bool = True,
        *,
        sequences: bool = False,
        vocabulary: Vocabulary | None = None,
    ) -> TokenHistory:
        """The history of ``prompt_ids`` ``[batch, n]``; counts inert unless ``track``, token
        sequences kept with ``sequences``."""
        rows = tuple(tuple(row) for row in prompt_ids.tolist()) if sequences else None
        lengths = tuple(len(row) for row in rows) if rows is not None else None
        if not track:
            return cls(None, None, rows, lengths, vocabulary)
        batch = prompt_ids.shape[0]
        counts = torch.zeros(batch, vocab_size, device=prompt_ids.device)
        seen = torch.zeros(batch, vocab_size, dtype=torch.bool, device=prompt_ids.device)
        return cls(counts, seen.scatter(1, prompt_ids, True), rows, lengths, vocabulary)

    @classmethod
    def for_config(
        cls,
        prompt_ids: Tensor,
        vocab_size: int,
        cfg: SamplingConfig,
        tokenizer: Any = None,
        eos_ids: Iterable[int] = (),
    ) -> TokenHistory:
        """Exactly what ``cfg``'s stages read: counts for penalties, sequences for DRY, bans and
        min-tokens (the prompt read back once, not per step), the tokenizer's vocabulary for those
        and for logit biases. Texts in ``logit_bias`` are resolved here, so a text that is not
        one token fails before the first token, in one line."""
        vocabulary = None
        if needs_vocabulary(cfg):
            if tokenizer is None:
                raise ValueError("these settings need the tokenizer")
            vocabulary = Vocabulary.of(tokenizer, vocab_size, eos_ids)
            try:
                bias_vector(vocabulary, cfg.logit_bias)
            except ConfigError as exc:
                raise UserError(f"logit_bias (--logit-bias or the preset): {exc.reason}") from exc
        history = cls.start(
            prompt_ids, vocab_size, cfg.has_penalties, sequences=needs_sequences(cfg), vocabulary=vocabulary
        )
        if not cfg.carries_state:
            return history
        state = carried_stages.initial_state(cfg, prompt_ids.shape[0], prompt_ids.device)
        return dataclasses.replace(history, state=state)

    def generated(self, row: int) -> tuple[int, ...]:
        """The ids generated so far in ``row`` (needs sequences)."""
        assert self.sequences is not None and self.prompt_lengths is not None
        return self.sequences[row][self.prompt_lengths[row] :]

    def advanced(self, tokens: Tensor, ids: Sequence[int] | None = None, state: Tensor | None = None) -> TokenHistory:
        """History after appending ``tokens`` (``[batch]``) to every row; a new object. ``ids``: the
        same tokens on the host, which the loops have from the step's transfer (read back here
        only when sequences are kept and the caller has none); ``state``: the carried stages'
        after those draws (:func:`llmsample.sampling.carried.observe`), else kept."""
        state = self.state if state is None else state
        sequences = self.sequences
        if sequences is not None:
            ids = tokens.view(-1).tolist() if ids is None else list(ids)
            sequences = tuple((*row, int(t)) for row, t in zip(sequences, ids, strict=True))
        if self.counts is None or self.seen is None:
            return TokenHistory(None, None, sequences, self.prompt_lengths, self.vocabulary, state=state)
        index = tokens.view(-1, 1)
        counts = self.counts.scatter_add(1, index, torch.ones_like(index, dtype=self.counts.dtype))
        seen = self.seen.scatter(1, index, True)
        return TokenHistory(counts, seen, sequences, self.prompt_lengths, self.vocabulary, state=state)

    def prefixes(self, tokens: Tensor, ids: Sequence[int] | None = None) -> TokenHistory:
        """From a one-row history, ``len(tokens) + 1`` rows: row i has ``tokens[:i]`` appended.
        Speculative verification and teacher forcing score every position at once with these; a
        carried stage's state is the row's at the first and follows the tokens after it."""
        rows = tokens.shape[0] + 1
        state = None if self.state is None else self.state.expand(rows, -1)
        carried = None
        if state is not None:
            carried = (-1, *(tokens.view(-1).tolist() if ids is None else [int(t) for t in ids]))
        sequences, lengths = self.sequences, self.prompt_lengths
        if sequences is not None and lengths is not None:
            ids = tokens.view(-1).tolist() if ids is None else [int(t) for t in ids]
            sequences = tuple((*sequences[0], *ids[:i]) for i in range(len(ids) + 1))
            lengths = (lengths[0],) * len(sequences)
        if self.counts is None or self.seen is None:
            return TokenHistory(None, None, sequences, lengths, self.vocabulary, state=state, carried=carried)
        steps = torch.nn.functional.one_hot(tokens, self.counts.shape[-1]).to(self.counts.dtype)
        # The first row is the history itself, also when nothing was drafted (``steps[:1]`` would be empty).
        cumulative = torch.cat([self.counts.new_zeros(1, self.counts.shape[-1]), steps.cumsum(0)], dim=0)
        seen = self.seen | (cumulative > 0)
        return TokenHistory(
            self.counts + cumulative, seen, sequences, lengths, self.vocabulary, state=state, carried=carried
        )

    def rows(self, index: slice) -> TokenHistory:
        """Some rows of the history (an inert one stays inert)."""
        sequences = self.sequences[index] if self.sequences is not None else None
        lengths = self.prompt_lengths[index] if self.prompt_lengths is not None else None
        allowed = self.allowed[index] if self.allowed is not None else None
        state = self.state[index] if self.state is not None else None
        carried = None if self.carried is None else (-1, *self.carried[index][1:])  # the first row starts
        counts = self.counts[index] if self.counts is not None else None
        seen = self.seen[index] if self.seen is not None else None
        return TokenHistory(counts, seen, sequences, lengths, self.vocabulary, allowed, state, carried)

    @classmethod
    def stack(cls, histories: Sequence[TokenHistory]) -> TokenHistory:
        """One history for rows sampled together (same settings, so the same kind of history)."""
        first = histories[0]
        sequences = lengths = None
        if first.sequences is not None:
            sequences = tuple(row for h in histories for row in h.sequences or ())
            lengths = tuple(n for h in histories for n in h.prompt_lengths or ())
        if len(histories) == 1:
            return first
        state = carried = None
        if first.state is not None:
            state = torch.cat([h.state for h in histories if h.state is not None])
            carried = tuple(t for h in histories for t in h.carried or (-1,) * h.state.shape[0])  # type: ignore[union-attr]
        if first.counts is None:
            return TokenHistory(None, None, sequences, lengths, first.vocabulary, state=state, carried=carried)
        counts = torch.cat([h.counts for h in histories if h.counts is not None])
        seen = torch.cat([h.seen for h in histories if h.seen is not None])
        return TokenHistory(counts, seen, sequences, lengths, first.vocabulary, state=state, carried=carried)


NO_HISTORY = TokenHistory(None, None)
"""For a chain with no penalties to apply (and for tests of the other stages)."""
