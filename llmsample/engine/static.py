"""Requests with their own prompts through the compiled step's static cache (``batch --compile``).

A wave of up to ``rows`` requests is left-padded and prefilled eagerly with its attention mask;
every step then runs the compiled graph with the mask over the whole cache (``[rows, bucket]``)
and each row's own position (``[rows, 1]``): tensors of fixed shapes whose values change, so one
graph serves every step of every wave. Rotary keys are stored rotated at their own positions and
the mask hides the padding, so a row decodes what it decodes alone.

A static cache's rows and columns are fixed: nobody joins mid-wave (``can_join = False``; the
loop admits the next wave once every row of this one has left, and the cache starts over). A
finished row keeps its slot, fed a dummy token whose logits nobody samples. One token per row
per step: no ragged verification, no per-row rollback (``--draft`` is refused with it)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from llmsample.engine.padded import PaddedBatch
from llmsample.errors import RuntimeFailure, UserError
from llmsample.models.compiled import CompiledStep, cache_arg
from llmsample.models.loading import LoadedModel
from llmsample.models.placement import input_device


class StaticBatch:
    """A padded :class:`~llmsample.models.compiled.CompiledStep` behind the backend seam
    (:mod:`llmsample.engine.backend`), leased for the run and given back on :meth:`close`."""

    can_join = False
    ragged = splits_ragged = False
    prefixes = joining = layers = None  # the seam's optional parts (llmsample.engine.backend): none here
    reused = None  # no prompt cache

    def __init__(self, lm: LoadedModel, rows: int, positions: int) -> None:
        """``positions``: the most any request of the run needs (prompt, tokens and one more)."""
        if lm.compiled is None:
            raise ValueError("a static batch needs a model loaded with --compile")
        if not PaddedBatch.attends_fully(lm.model):
            raise UserError(
                "batch --compile pads rows of full attention, and this model has sliding-window layers; "
                "run it without --compile"
            )
        self.model = lm.model
        self.cache_arg = cache_arg(lm.model)
        self.device = input_device(lm.model)
        self.sample_device = lm.sample_device
        self.compiled = lm.compiled.lease(rows, positions, padded=True)
        self._release: Callable[[CompiledStep], None] | None = lm.compiled.release
        self.compile_s = self.compiled.compile_s
        # Ordinary tensors, made outside inference mode, like the graph's warm-up inputs.
        self.mask = torch.zeros(rows, self.compiled.bucket, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=self.device)
        self.width = 0  # columns of the cache written by this wave
        self.slots: list[int] = []  # the cache row of each live row, in the loop's order

    def admit(self, prompts: list[list[int]]) -> Tensor:
        """A new wave: every slot prefilled together, left-padded (slots beyond ``prompts`` get
        one dummy token); the prompts' next-token logits ``[len(prompts), vocab]``."""
        rows, bucket = self.mask.shape
        if self.slots or len(prompts) > rows:
            raise ValueError(f"a static batch admits a wave of up to {rows} rows once the last one has left")
        width = max(len(p) for p in prompts)
        if width >= bucket:
            raise RuntimeFailure(f"a prompt of {width} tokens does not fit the static cache of {bucket} positions")
        filled = prompts + [[0]] * (rows - len(prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in filled], device=self.device)
        mask = torch.zeros(rows, bucket, dtype=torch.long, device=self.device)
        mask[:, :width] = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in filled])
        positions = (mask[:, :width].cumsum(-1) - 1).clamp_min(0)
        with torch.inference_mode():
            self.compiled.cache.reset()
            logits = self._forward(
                lambda: self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self.cache_arg: self.compiled.cache},
                ).logits[:, -1]
            )
        self.mask, self.width = mask, width
        self.positions = torch.tensor([[len(p)] for p in filled], device=self.device)
        self.slots = list(range(len(prompts)))
        return logits[: len(prompts)]

    def admit_copies(self, prompt: list[int], copies: int) -> Tensor:
        return self.admit([prompt] * copies)

    def step(self, tokens: Tensor) -> Tensor:
        """One token per live row in; the compiled graph writes column ``width`` of every slot."""
        if self.width >= self.mask.shape[1]:
            raise RuntimeFailure(f"the static cache of {self.mask.shape[1]} positions is full")
        full = torch.zeros(self.mask.shape[0], 1, dtype=torch.long, device=self.device)
        full[self.slots] = tokens.view(-1, 1).to(self.device)
        self.mask[:, self.width] = 1
        with torch.inference_mode():
            logits = self._forward(lambda: self.compiled.step(full, self.mask, self.positions))
        self.positions += 1
        self.width += 1
        return logits[self.slots]

    def verify(self, tokens: list[list[int]]) -> Tensor:
        raise ValueError("a static batch steps one token per row (ragged is False)")

    def rollback(self, row: int, length: int) -> None:
        raise ValueError("a static batch cannot roll one row back (speculation needs the padded batch)")

    def keep(self, rows: list[int]) -> None:
        self.slots = [self.slots[i] for i in rows]

    def agree(self, tokens: Tensor) -> Tensor:
        return tokens

    def close(self) -> None:
        if self._release is not None:
            self._release(self.compiled)
            self._release = None

    def _forward(self, run: Callable[[], Tensor]) -> Tensor:
        """``run()``'s logits as float32 on the sample device; running out of memory is a runtime
        failure that names the batch."""
        try:
            logits = run()
        except torch.OutOfMemoryError as exc:
            raise RuntimeFailure(
                f"out of memory on {self.device} with {self.mask.shape[0]} rows of {self.mask.shape[1]} positions; "
                "try a smaller --batch-size"
            ) from exc
        return logits.float().to(self.sample_device)
