"""A causal LM with its KV cache: prefill once, then extend by one or more tokens, and roll
back by position after a speculative rejection. This is the seam every loop decodes through,
and the place another forward-pass backend would plug in.

With ``--compile`` the runner leases a compiled one-token step and its static cache from the
model (``llmsample.models.compiled``); everything else (prefill, multi-token verification) runs
eagerly on the same cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from llmsample.errors import RuntimeFailure
from llmsample.models.compiled import CompiledStep, cache_arg
from llmsample.models.loading import LoadedModel


class ModelRunner:
    """Owns the cache of one sequence batch; callers see only float32 logits."""

    def __init__(
        self,
        model: Any,
        compiled: CompiledStep | None = None,
        release: Callable[[CompiledStep], None] | None = None,
    ) -> None:
        """``compiled``: a leased step (given back through ``release`` on :meth:`close`); None runs eagerly."""
        self.model = model
        self.cache_arg = cache_arg(model)
        self.compiled = compiled
        self._release = release
        self.cache: Any = compiled.cache if compiled is not None else None
        self.length = 0
        self.tensor_parallel = False

    @classmethod
    def for_run(cls, lm: LoadedModel, batch: int, max_length: int) -> ModelRunner:
        """Eager, or with a compiled step leased for ``batch`` rows of ``max_length`` positions when
        the model was loaded with ``--compile``. Close it (or use it as a context manager)."""
        runner = (
            cls(lm.model)
            if lm.compiled is None
            else cls(lm.model, lm.compiled.lease(batch, max_length), lm.compiled.release)
        )
        runner.tensor_parallel = lm.tensor_parallel
        return runner

    def agree(self, tokens: Tensor) -> Tensor:
        """The tokens every rank feeds next: with tensor parallelism rank 0's draws, broadcast, so
        ranks whose logits differ in the last bit never diverge; otherwise ``tokens`` as they are."""
        if self.tensor_parallel:
            import torch.distributed as dist

            dist.broadcast(tokens, src=0)
        return tokens

    @property
    def compile_s(self) -> float:
        return self.compiled.compile_s if self.compiled is not None else 0.0

    def close(self) -> None:
        """Give the compiled step back to its model; idempotent."""
        if self.compiled is not None and self._release is not None:
            self._release(self.compiled)
            self._release = None

    def __enter__(self) -> ModelRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @torch.inference_mode()
    def prefill(self, input_ids: Tensor) -> Tensor:
        """Logits for the next token after the prompt, ``[batch, vocab]``."""
        self.reset()
        return self.extend(input_ids, keep_last=True)[:, -1]

    @torch.inference_mode()
    def reset(self) -> None:
        """An empty cache (speculation starts this way and feeds the prompt itself)."""
        from transformers import DynamicCache

        if self.compiled is not None:
            self.cache.reset()
        else:
            self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def extend(self, tokens: Tensor, keep_last: bool = False) -> Tensor:
        """Feed ``[batch, n]`` tokens; logits after each of them, ``[batch, n, vocab]`` (only the
        last position with ``keep_last``: a long prompt's logits would cost vocab floats per token)."""
        n = tokens.shape[1]
        try:
            if self.compiled is not None and n == 1:
                logits = self.compiled.step(tokens)[:, None]
            else:
                out = self.model(
                    input_ids=tokens,
                    use_cache=True,
                    logits_to_keep=1 if keep_last else 0,
                    **{self.cache_arg: self.cache},
                )
                logits = out.logits
        except torch.OutOfMemoryError as exc:
            raise RuntimeFailure(
                f"out of memory on {tokens.device} at {self.length + n} tokens; "
                "try --dtype bfloat16, fewer --max-tokens or a smaller model"
            ) from exc
        self.length += n
        return logits.float()

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """One token per row in, next-token logits ``[batch, vocab]`` out."""
        return self.extend(tokens.view(-1, 1))[:, -1]

    @torch.inference_mode()
    def rollback(self, length: int) -> None:
        """Forget every position from ``length`` on."""
        removed = self.length - length
        if removed > 0:  # a negative count means "remove this many" in both old and new transformers
            self.cache.crop(-removed)
        self.length = min(length, self.length)
