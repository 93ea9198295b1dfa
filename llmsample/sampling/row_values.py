"""The settings the rows of one chain call may differ in (temperature, top-p, min-p), one value a
row, and the stages that read them: a batch of requests with their own values still makes one
chain call per sampler."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.filters import apply_temperature, keep_min_p, keep_top_p


@dataclass(frozen=True)
class RowValues:
    """The settings the rows of one chain call may differ in, one value per row ``[batch, 1]``
    (top-p and min-p in float64, as a float setting is): rows that differ only in these and in
    their seeds share the call (the engine also keeps apart rows whose top-p or min-p is off, which
    would widen every row's candidates). Each row's stages keep the tokens and logits it gets
    alone; the softmax over candidates can differ in the last bit with their width
    (:func:`filters.kept_candidates`)."""

    temperature: Tensor
    top_p: Tensor
    min_p: Tensor

    @classmethod
    def of(cls, cfgs: Sequence[SamplingConfig], device: torch.device) -> RowValues | None:
        """None when every row has the same values (the chain then reads its config's)."""
        values = tuple((cfg.temperature, cfg.top_p, cfg.min_p) for cfg in cfgs)
        return None if all(v == values[0] for v in values) else _row_values(values, device)


@functools.lru_cache(maxsize=64)
def _row_values(values: tuple[tuple[float, float, float], ...], device: torch.device) -> RowValues:
    """Made once for a group's values (a copy to an accelerator waits on it), not every step."""
    columns = torch.tensor(values, dtype=torch.float64, device=device).unsqueeze(-1).unbind(1)
    return RowValues(columns[0].float(), columns[1], columns[2])


PER_ROW: dict[str, Callable[[Tensor, RowValues], Tensor]] = {
    "temperature": lambda logits, values: apply_temperature(logits, values.temperature),
    "top_p": lambda logits, values: keep_top_p(logits, values.top_p),
    "min_p": lambda logits, values: keep_min_p(logits, values.min_p),
}
"""The stages that read :class:`RowValues` when a chain call has them."""
