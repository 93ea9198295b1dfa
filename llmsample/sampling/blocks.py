"""Exact rankings over a CPU vocabulary row from its block maxima: a 49k row's ``topk`` costs
~150 µs in torch there, its blocks' maxima ~8 µs, and the top m tokens always lie in the m blocks
with the largest maxima. So the top m are found among m blocks, and the tokens above a value
among the blocks whose maximum is above it."""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 64
"""Tokens per block: a 49k row has 768 blocks, and the top 40 lie in 40 x 64 tokens."""


def blocks_pay(logits: Tensor, m: int) -> bool:
    """Whether m blocks are a small part of the row (else torch's own pass is as fast)."""
    return logits.is_cpu and logits.shape[-1] % BLOCK == 0 and 0 < m * BLOCK * 8 <= logits.shape[-1]


def block_maxima(logits: Tensor) -> Tensor:
    """``[batch, vocab // BLOCK]``: each block's maximum (a NaN block's is NaN)."""
    return logits.unflatten(-1, (-1, BLOCK)).amax(-1)


def top(logits: Tensor, m: int, maxima: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``logits.topk(m, dim=-1)``: the m largest values per row, descending, and their ids, a NaN
    ranked first as ``topk`` ranks it. The values are exactly ``topk``'s; among tokens tied at the
    m-th value the ids are a valid choice, and a row's choice does not depend on the rows beside
    it. Every token above the m-th largest block maximum is in those m blocks, and they hold m
    tokens at least as large, so the m largest of their tokens are the row's. ``maxima``: the
    row's :func:`block_maxima`, when the caller has them."""
    if not blocks_pay(logits, m):
        return logits.topk(m, dim=-1)
    maxima = block_maxima(logits) if maxima is None else maxima
    chosen = maxima.topk(m, dim=-1).indices  # [batch, m]
    ids = _tokens_of(chosen)
    values, at = logits.gather(-1, ids).topk(m, dim=-1)
    return values, ids.gather(-1, at)


def count_above(logits: Tensor, value: Tensor, maxima: Tensor | None = None) -> Tensor:
    """Per row, how many logits are strictly above ``value`` ``[batch, 1]`` (a rank minus one), as
    int32: counted inside the blocks whose maximum is above it, when few are (a likely token's
    rank), else over the whole row."""
    if not blocks_pay(logits, 1) or bool(value.isnan().any()):
        return count_true(logits > value)
    maxima = block_maxima(logits) if maxima is None else maxima
    if bool(maxima.isnan().any()):  # a NaN block's maximum says nothing of its other tokens
        return count_true(logits > value)
    above = maxima > value
    width = int(count_true(above).max())
    if width * BLOCK * 8 > logits.shape[-1]:
        return count_true(logits > value)
    if width == 0:
        return torch.zeros(logits.shape[:-1], dtype=torch.int32, device=logits.device)
    # The blocks above come first (a stable sort of the mask puts them in front); a row with fewer
    # pads with blocks below, whose tokens are not above the value.
    chosen = above.to(torch.uint8).sort(dim=-1, descending=True, stable=True).indices[..., :width]
    ids = _tokens_of(chosen)
    return count_true(logits.gather(-1, ids) > value)


def _tokens_of(chosen: Tensor) -> Tensor:
    """The token ids of the blocks ``chosen`` ``[batch, n]``, block by block ``[batch, n * BLOCK]``."""
    offsets = _OFFSETS.get(chosen.device)
    if offsets is None:
        offsets = _OFFSETS[chosen.device] = torch.arange(BLOCK, device=chosen.device)
    return torch.add(offsets, chosen.unsqueeze(-1), alpha=BLOCK).flatten(-2)  # one call: offsets + BLOCK x block


_OFFSETS: dict[torch.device, Tensor] = {}
"""``arange(BLOCK)`` per device, made once."""


def count_true(mask: Tensor) -> Tensor:
    """Per row, how many of a bool mask are set. Summing its bytes into int32 skips the copy to
    int64 that torch makes to sum a bool tensor: a third of the time on a 49k CPU row."""
    return mask.view(torch.uint8).sum(-1, dtype=torch.int32)
