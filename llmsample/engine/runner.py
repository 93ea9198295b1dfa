"""A causal LM with its KV cache: prefill once, then extend by one or more tokens, and roll
back by position after a speculative rejection.

With ``compile`` the cache is preallocated (transformers' ``StaticCache``) and the one-token
decode step goes through ``torch.compile``, its attention written for one query (``attention``);
everything else (prefill, multi-token verification) runs eagerly on the same cache."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from llmsample.errors import RuntimeFailure, UserError

LENGTH_BUCKET = 256
"""Static caches are sized in multiples of this: one compilation serves every run in a bucket.
The decode step attends over the whole cache, so a smaller bucket is a faster step (bfloat16:
~3.6 ms per 256 slots here) but more distinct compilations."""

_compiled: dict[tuple[int, int, int], tuple[Any, Callable[[Tensor], Tensor], float]] = {}


def _cache_arg(model: Any) -> str:
    """transformers 5.x renamed the cache argument; older releases only know the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def compiled_step(model: Any, batch: int, max_length: int) -> tuple[Any, Callable[[Tensor], Tensor], float]:
    """A static cache and the compiled decode step over it, built once per (model, batch, length
    bucket) in a process; inductor's graph cache on disk (under the llmsample cache) serves later
    runs.
    Returns the cache, the step, and the seconds compilation took (0 when reused)."""
    bucket = -(-max_length // LENGTH_BUCKET) * LENGTH_BUCKET
    key = (id(model), batch, bucket)
    if key in _compiled:
        cache, step, _ = _compiled[key]
        return cache, step, 0.0
    from llmsample.models.loading import cache_home

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_home() / "inductor"))
    from transformers import StaticCache

    from llmsample.engine import attention

    if model.config._attn_implementation == "sdpa":  # the decode attention hands other shapes to SDPA
        model.set_attn_implementation(attention.register())
    # Not inductor's `freezing`: prepacked frozen weights measured ~4% faster per step here, but
    # they keep the compiled graph out of the on-disk cache (38 s at every start, against 12.5 s
    # for a cached second start; bench/NOTES.md).
    cache = StaticCache(config=model.config, max_cache_len=bucket)
    name = _cache_arg(model)

    def decode(tokens: Tensor) -> Tensor:
        return model(input_ids=tokens, use_cache=True, **{name: cache}).logits[:, -1]

    step = torch.compile(decode, dynamic=False)
    start = time.perf_counter()
    # An ordinary tensor, like the loop's tokens: an inference-mode one would compile a second graph.
    dummy = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    try:
        with torch.inference_mode():
            decode(dummy)  # eagerly first: the cache allocates its tensors lazily, which would recompile
            step(dummy)  # compile now, so the first real token is not the slow one
            cache.reset()
    except Exception as exc:  # inductor needs a working C++ toolchain; say so instead of a traceback
        if _out_of_memory(exc):
            raise RuntimeFailure(
                f"out of memory while compiling the decode step on {model.device}; "
                "run without --compile, or try --dtype bfloat16 or a smaller model"
            ) from exc
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--compile failed ({first}); run without --compile") from exc
    elapsed = time.perf_counter() - start
    _compiled[key] = (cache, step, elapsed)
    return cache, step, elapsed


def _out_of_memory(exc: BaseException | None) -> bool:
    """Dynamo and inductor wrap what failed inside them (BackendCompilerFailed, ...): look down
    the chain, since running out of memory is a runtime failure (exit 1), not a usage error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class ModelRunner:
    """Owns the cache of one sequence batch; callers see only float32 logits."""

    def __init__(self, model: Any, compile_for: tuple[int, int] | None = None) -> None:
        """``compile_for``: ``(batch, max_length)`` to preallocate and compile; None runs eagerly."""
        self.model = model
        self.cache_arg = _cache_arg(model)
        self.cache: Any = None
        self.length = 0
        self.compiled: Callable[[Tensor], Tensor] | None = None
        self.compile_s = 0.0
        if compile_for is not None:
            self.cache, self.compiled, self.compile_s = compiled_step(model, *compile_for)

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
                logits = self.compiled(tokens)[:, None]
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
