"""Attention for the compiled decode step: one query token against a preallocated cache.

On CPU, SDPA's flash kernel spends ~0.4 ms per layer (bfloat16) on a single query over a
256–512 slot static cache, most of it mask handling; the same arithmetic written as
multiply-and-sum is fused by inductor into the step's own kernels (docs/history/2026-11.md). Every other
shape (prefill, speculative verification) goes to transformers' SDPA unchanged."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "llmsample_decode"


def decode_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query ``[b, heads, q, d]``, key and value
    ``[b, kv_heads, kv, d]``, and a boolean (or additive) mask from SDPA's mask builder."""
    # A position bias (ALiBi-style models) changes the arithmetic: SDPA's wrapper handles it.
    if query.shape[2] != 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    # The query heads that share a key/value head attend together, without repeating K/V. Both
    # products are written as multiply-and-sum in float32: inductor fuses them into one loop
    # over the cache, where a bf16 ``bmm`` call costs ~0.12 ms each on an AVX2 CPU.
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, 1, dim).float()
    scores = (grouped * key.unsqueeze(2).float()).sum(-1) * scale  # [b, kv_heads, groups, kv]
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    weights = scores.softmax(-1)
    out = (weights.unsqueeze(-1) * value.unsqueeze(2).float()).sum(-2)  # [b, kv_heads, groups, d]
    return out.to(value.dtype).reshape(batch, 1, heads, dim), None


def register() -> str:
    """Make ``NAME`` an attention implementation models can be switched to (mask: SDPA's)."""
    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME
