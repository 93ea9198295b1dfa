"""Batch-invariant decoding (``--deterministic``): a row's numbers do not depend on what else is
in the batch, nor on how its prompt reached the cache (vLLM's and SGLang's batch-invariant
modes get there with kernels of fixed reduction order; this gets there with fixed shapes).

Matrix kernels, bf16 and float32 alike, pick their blocking and reduction order from the
shapes they are given: a row's logits change in the last bits with the number of rows beside
it, the padding of the batch, and whether its prompt was prefilled whole or as a cached prefix
plus the rest (a chat's next turn, a multi-token verification). Here every forward pass holds
**one row and one position**: each row has a backend of its own (a one-row cache: a padded
batch of one, a llama.cpp context of its own), its prompt is prefilled position by position,
and a step or a verification feeds each row's tokens one at a time. Position ``p`` of a row is
then always computed by the same kernels on the same shapes from the same cache, whatever
runs beside it. The cost is a pass per row per position (measured in docs/determinism.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Backend = Any  # an llmsample.engine.backend.Backend: that module opens this one, so it is not imported here


class DeterministicBackend:
    """The :class:`~llmsample.engine.backend.Backend` seam over one-row backends that
    ``open_row`` makes (one per row; position 0 is each one's ``admit``, every later position
    a one-token ``step``). ``lengths[row]``: the positions row ``row``'s cache holds."""

    can_join = True  # a joining row gets a backend of its own: nobody else's cache changes
    splits_ragged = False  # every row passes alone
    prefixes = joining = layers = None  # the seam's optional parts (llmsample.engine.backend): none here
    reused = None  # no prompt cache

    def __init__(self, open_row: Callable[[], Backend]) -> None:
        self.open_row = open_row
        self.spare: Backend | None = open_row()  # the next row's; tells the device and the kind
        self.sample_device: torch.device = self.spare.sample_device
        self.ragged: bool = self.spare.ragged
        self.compile_s: float = self.spare.compile_s
        self.inner: list[Backend] = []
        self.lengths: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.inner)

    def admit(self, prompts: list[list[int]]) -> Tensor:
        """Each prompt into a backend of its own, one position per pass."""
        parts = []
        for prompt in prompts:
            self.inner.append(self._fresh())
            self.lengths.append(0)
            for token in prompt[:-1]:
                self._feed(self.rows - 1, torch.tensor([token]))
            parts.append(self._feed(self.rows - 1, torch.tensor([prompt[-1]])))
        return torch.cat(parts)

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        """Each copy prefilled on its own: a replicated cache would be another row's numbers only
        as long as nothing differs in how the two were made."""
        return self.admit([prompt] * copies)

    def step(self, tokens: Tensor) -> Tensor:
        """Each row's token through its own backend; ``[rows, vocab]``."""
        return torch.cat([self._feed(r, tokens.view(-1)[r : r + 1]) for r in range(self.rows)])

    def verify(self, tokens: list[list[int]]) -> Tensor:
        """Each row's tokens one position at a time; ``[rows, longest, vocab]`` (zeros past a
        row's own count), the numbers single steps would give."""
        width = max(len(row) for row in tokens)
        out: Tensor | None = None
        for r, row in enumerate(tokens):
            for i, token in enumerate(row):
                logits = self._feed(r, torch.tensor([token]))
                if out is None:
                    out = logits.new_zeros(len(tokens), width, logits.shape[-1])
                out[r, i] = logits[0]
        assert out is not None
        return out

    def rollback(self, row: int, length: int) -> None:
        """Row ``row``'s backend forgets positions from ``length`` on (all of them: a new one)."""
        if length == 0:
            self.inner[row].close()
            self.inner[row] = self._fresh()
        else:
            self.inner[row].rollback(0, length)
        self.lengths[row] = min(self.lengths[row], length)

    def keep(self, rows: list[int]) -> None:
        """The rows that left close their backends."""
        kept = set(rows)
        for r, backend in enumerate(self.inner):
            if r not in kept:
                backend.close()
        self.inner = [self.inner[r] for r in rows]
        self.lengths = [self.lengths[r] for r in rows]

    def agree(self, tokens: Tensor) -> Tensor:
        return self.inner[0].agree(tokens) if self.inner else tokens

    def close(self) -> None:
        """Close every row's backend and the spare; idempotent."""
        for backend in [*self.inner, *([self.spare] if self.spare is not None else [])]:
            backend.close()
        self.inner, self.lengths, self.spare = [], [], None

    def _fresh(self) -> Backend:
        backend, self.spare = self.spare, None
        return backend if backend is not None else self.open_row()

    def _feed(self, row: int, token: Tensor) -> Tensor:
        """One token at row ``row``'s next position; its next-token logits ``[1, vocab]``. An
        empty cache's first position is an ``admit`` (a one-token prompt), so position 0 is
        always computed by the same call."""
        backend = self.inner[row]
        logits = backend.admit([[int(token.item())]]) if self.lengths[row] == 0 else backend.step(token)
        self.lengths[row] += 1
        return logits
