"""What the penalties look at: the tokens seen so far, per row."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TokenHistory:
    """Counts of generated tokens and the set of tokens seen anywhere (prompt or generated), both
    ``[batch, vocab]``; or inert (both None) when no penalty is on, so the loops never branch."""

    counts: Tensor | None
    seen: Tensor | None

    @classmethod
    def start(cls, prompt_ids: Tensor, vocab_size: int, track: bool = True) -> TokenHistory:
        """The history of ``prompt_ids`` ``[batch, n]``; inert unless ``track``."""
        if not track:
            return cls(None, None)
        batch = prompt_ids.shape[0]
        counts = torch.zeros(batch, vocab_size, device=prompt_ids.device)
        seen = torch.zeros(batch, vocab_size, dtype=torch.bool, device=prompt_ids.device)
        return cls(counts, seen.scatter(1, prompt_ids, True))

    @property
    def inert(self) -> bool:
        return self.counts is None

    def advanced(self, tokens: Tensor) -> TokenHistory:
        """History after appending ``tokens`` (``[batch]``) to every row; a new object."""
        if self.counts is None or self.seen is None:
            return self
        index = tokens.view(-1, 1)
        counts = self.counts.scatter_add(1, index, torch.ones_like(index, dtype=self.counts.dtype))
        return TokenHistory(counts, self.seen.scatter(1, index, True))

    def prefixes(self, tokens: Tensor) -> TokenHistory:
        """From a one-row history, ``len(tokens) + 1`` rows: row i has ``tokens[:i]`` appended.
        Speculative verification and teacher forcing score every position at once with these."""
        if self.counts is None or self.seen is None:
            return self
        steps = torch.nn.functional.one_hot(tokens, self.counts.shape[-1]).to(self.counts.dtype)
        # The first row is the history itself, also when nothing was drafted (``steps[:1]`` would be empty).
        cumulative = torch.cat([self.counts.new_zeros(1, self.counts.shape[-1]), steps.cumsum(0)], dim=0)
        return TokenHistory(self.counts + cumulative, self.seen | (cumulative > 0))

    def rows(self, index: slice) -> TokenHistory:
        """Some rows of the history (an inert one stays inert)."""
        if self.counts is None or self.seen is None:
            return self
        return TokenHistory(self.counts[index], self.seen[index])


NO_HISTORY = TokenHistory(None, None)
"""For a chain with no penalties to apply (and for tests of the other stages)."""
