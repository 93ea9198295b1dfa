"""The draw: one token per row by inverse CDF, over a tensor of probabilities, or on the host for
a CPU chain's few candidates (:func:`host_indices`: the same arithmetic, a float64 running sum
from the left, the first step above ``u x total``, the argmax where that lands on a zero, in
Python floats, for the dozen torch calls a tensor draw makes on a row of forty values)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from llmsample.sampling import filters

HOST_WIDTH = 256
"""Up to this many candidates a row the draw runs on the host (a top-k's or a top-p's few)."""


def host_indices(rows: list[list[float]], u_rows: list[float]) -> list[int] | None:
    """Per row of probabilities (float32 values, read exactly as Python floats), the index drawn
    with its uniform in [0, 1): what the tensor draw picks, bit for bit (its float64 cumulative
    sum on a CPU adds from the left, as :func:`itertools.accumulate` does). None when a row's
    total is not finite (NaN, inf: a broken row, which the tensor draw's search ranks its own way)."""
    picked = []
    for probs, u in zip(rows, u_rows, strict=True):
        cdf = list(itertools.accumulate(probs))
        if not math.isfinite(cdf[-1]):
            return None
        index = min(bisect.bisect_right(cdf, u * cdf[-1]), len(probs) - 1)
        if not probs[index] > 0:  # the rare float64 edge (or a zero row): the first maximum
            index = probs.index(max(probs))
        picked.append(index)
    return picked


def draw(probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """One token per row by inverse CDF: one uniform per row (``torch.multinomial`` costs ~1.7 ms
    on a 49k vocabulary here, this ~0.1 ms). A zero-probability token is never drawn: its CDF step
    is flat, and the float64 edge where u x total rounds up to the total falls back to the argmax.

    ``generator``: one for the whole batch, or one per row; row i then draws exactly what it
    draws alone from ``generator[i]``, with one cumulative sum for the batch."""
    return draw_with(probs, uniforms(probs, generator))


def uniforms(probs: Tensor, generator: torch.Generator | Sequence[torch.Generator] | None) -> Tensor:
    """The draw's one float64 uniform per row ``[batch, 1]``, from the batch's or each row's generator."""
    device = probs.device
    if isinstance(generator, Sequence) and len(generator) == 1:  # one row's: no concatenation
        return torch.rand(1, 1, generator=generator[0], dtype=torch.float64, device=device)
    if isinstance(generator, Sequence):
        return torch.cat([torch.rand(1, 1, generator=g, dtype=torch.float64, device=device) for g in generator])
    return torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=device)


def draw_with(probs: Tensor, u: Tensor) -> Tensor:
    """:func:`draw` with its uniforms ``u`` ``[batch, 1]`` drawn."""
    cdf = probs.double().cumsum(-1)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)
    drawn = probs.gather(-1, index) > 0
    if filters.host_syncs_are_free(drawn) and bool(drawn.all()):  # the edge is rare: skip the argmax pass
        return index.squeeze(-1)
    return torch.where(drawn, index, probs.argmax(-1, keepdim=True)).squeeze(-1)
