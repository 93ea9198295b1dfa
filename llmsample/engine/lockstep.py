"""Rows of one prompt advancing together over one cache of equal lengths: the backend for a
compiled decode step (``--compile``: a static cache of rows x positions, on CUDA replayed as a
graph) and for tensor parallelism (``--tp``: every rank feeds rank 0's tokens).

Rows cannot join once decoding started; a row that leaves keeps its slot in the cache (its
tokens are ignored), since a static cache's shape is fixed. Per-row rollback needs one row."""

from __future__ import annotations

import torch
from torch import Tensor

from llmsample.engine.runner import ModelRunner
from llmsample.models.loading import LoadedModel


class LockstepBatch:
    """A :class:`ModelRunner` behind the backend seam (:mod:`llmsample.engine.backend`)."""

    can_join = False
    splits_ragged = False
    prefixes = joining = layers = None  # the seam's optional parts (llmsample.engine.backend): none here
    reused = None  # no prompt cache

    def __init__(self, lm: LoadedModel, rows: int, positions: int) -> None:
        self.runner = ModelRunner.for_run(lm, rows, positions)
        self.sample_device = self.runner.sample_device
        self.compile_s = self.runner.compile_s
        self.slots: list[int] = []  # the runner's row of each live row, in the loop's order
        self._rows = 0  # rows in the cache, live or not

    @property
    def ragged(self) -> bool:
        return len(self.slots) <= 1

    def admit(self, prompts: list[list[int]]) -> Tensor:
        if self.slots or len({tuple(p) for p in prompts}) != 1:
            raise ValueError("a lockstep batch prefills one prompt, once")
        return self.admit_copies(prompts[0], len(prompts))

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        ids = torch.tensor([prompt], device=self.runner.device).expand(copies, -1)
        self.slots, self._rows = list(range(copies)), copies
        return self.runner.prefill(ids)

    def step(self, tokens: Tensor) -> Tensor:
        return self.runner.step(self._every_slot(tokens))[self.slots]

    def verify(self, tokens: list[list[int]]) -> Tensor:
        if len({len(t) for t in tokens}) != 1:
            raise ValueError("lockstep rows verify equally many tokens")
        fed = torch.tensor(tokens, device=self.runner.device)
        return self.runner.extend(self._every_slot(fed))[self.slots]

    def rollback(self, row: int, length: int) -> None:
        self.runner.rollback(length)  # ``ragged`` promises this only with one row

    def keep(self, rows: list[int]) -> None:
        self.slots = [self.slots[i] for i in rows]

    def agree(self, tokens: Tensor) -> Tensor:
        return self.runner.agree(tokens)

    def close(self) -> None:
        self.runner.close()

    def _every_slot(self, tokens: Tensor) -> Tensor:
        """Tokens for every slot of the cache: the live rows' in their slots, zeros elsewhere."""
        if len(self.slots) == self._rows:
            return tokens
        full = tokens.new_zeros((self._rows, *tokens.shape[1:]))
        full[torch.tensor(self.slots, device=tokens.device)] = tokens.to(full.device)
        return full
