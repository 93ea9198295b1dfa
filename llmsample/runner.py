"""A causal LM with its KV cache: prefill once, then extend by one or more tokens, and roll
back by position after a speculative rejection."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from llmsample.errors import RuntimeFailure


class ModelRunner:
    """Owns the cache of one sequence batch; callers see only logits as float32 ``[batch, ..., vocab]``."""

    def __init__(self, model: Any) -> None:
        self.model = model
        # transformers 5.x renamed the cache argument; older releases only know the old name.
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.cache: Any = None
        self.attention_mask: Tensor | None = None
        self.length = 0

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Logits for the next token after the prompt, ``[batch, vocab]``.

        ``attention_mask`` (left padding) is only needed for batches of unequal prompts."""
        self.reset(attention_mask)
        return self.extend(input_ids, keep_last=True)[:, -1]

    def reset(self, attention_mask: Tensor | None = None) -> None:
        """An empty cache (speculation starts this way and feeds the prompt itself)."""
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.attention_mask = attention_mask
        self.length = 0

    @torch.inference_mode()
    def extend(self, tokens: Tensor, keep_last: bool = False) -> Tensor:
        """Feed ``[batch, n]`` tokens; logits after each of them, ``[batch, n, vocab]`` (only the
        last position with ``keep_last``: a long prompt's logits would cost vocab floats per token)."""
        n = tokens.shape[1]
        kwargs: dict[str, Any] = {}
        if self.attention_mask is not None:
            if self.attention_mask.shape[1] < self.length + n:
                ones = self.attention_mask.new_ones(tokens.shape[0], self.length + n - self.attention_mask.shape[1])
                self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
            mask = self.attention_mask[:, : self.length + n]
            kwargs["attention_mask"] = mask
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -n:]
        try:
            out = self.model(
                input_ids=tokens,
                use_cache=True,
                logits_to_keep=1 if keep_last else 0,
                **{self.cache_arg: self.cache},
                **kwargs,
            )
        except torch.OutOfMemoryError as exc:
            raise RuntimeFailure(
                f"out of memory on {tokens.device} at {self.length + n} tokens; "
                "try --dtype bfloat16, fewer --max-tokens or a smaller model"
            ) from exc
        self.length += n
        return out.logits.float()

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """One token per row in, next-token logits ``[batch, vocab]`` out."""
        return self.extend(tokens.view(-1, 1))[:, -1]

    def rollback(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        removed = self.length - length
        if removed > 0:  # a negative count means "remove this many" in both old and new transformers
            self.cache.crop(-removed)
        self.length = min(length, self.length)
