"""``--compile``: a model's one-token decode step through ``torch.compile``, over a preallocated
cache (transformers' ``StaticCache``), its attention written for one query (``attention``).

The loaded model owns its compiled steps (:class:`CompiledSteps`); a runner leases one for the
length of a run and gives it back, so two runners never share a static cache by accident, and
the steps live exactly as long as the model that holds them."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.errors import RuntimeFailure, UserError, first_line

LENGTH_BUCKET = 256
"""Static caches are sized in multiples of this: one compilation serves every run in a bucket.
The decode step attends over the whole cache, so a smaller bucket is a faster step (bfloat16:
~3.6 ms per 256 slots here) but more distinct compilations."""


def cache_arg(model: Any) -> str:
    """transformers 5.x renamed the cache argument; older releases only know the old name."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass
class CompiledStep:
    """A static cache for ``batch`` rows of up to ``bucket`` positions and the compiled step that
    decodes one token per row into it. A ``padded`` step also takes the attention mask over the
    whole cache (``[batch, bucket]``) and each row's position (``[batch, 1]``): rows of different
    prompts, left-padded (``batch --compile``); the others advance rows of one prompt."""

    batch: int
    bucket: int
    cache: Any
    step: Callable[..., Tensor]
    compile_s: float  # what building it cost; 0 once it is reused
    padded: bool = False


class CompiledSteps:
    """The compiled decode steps of one model, built on first use per (batch, length bucket) and
    leased to one runner at a time. Building the first one switches the model's attention to
    :mod:`llmsample.models.attention` (it hands every other shape to SDPA, so eager passes keep
    their results); the bench switches back for its reference runs."""

    def __init__(self, model: Any, cache_dir: str) -> None:
        self.model = model
        self.cache_dir = cache_dir
        self._free: dict[tuple[int, int, bool], list[CompiledStep]] = {}

    def lease(self, batch: int, max_length: int, padded: bool = False) -> CompiledStep:
        """A step nobody else holds: a free one of this shape, or a newly built one."""
        bucket = -(-max_length // LENGTH_BUCKET) * LENGTH_BUCKET
        free = self._free.get((batch, bucket, padded))
        if free:
            step = free.pop()
            step.compile_s = 0.0
            with torch.inference_mode():  # the cache's tensors were made there
                step.cache.reset()
            return step
        return self._build(batch, bucket, padded)

    def release(self, step: CompiledStep) -> None:
        self._free.setdefault((step.batch, step.bucket, step.padded), []).append(step)

    def _build(self, batch: int, bucket: int, padded: bool) -> CompiledStep:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", self.cache_dir)
        from transformers import StaticCache

        from llmsample.models import attention

        model = self.model
        if model.config._attn_implementation == "sdpa":  # the decode attention hands other shapes to SDPA
            model.set_attn_implementation(attention.register())
        # Not inductor's `freezing`: prepacked frozen weights measured ~4% faster per step here, but
        # they keep the compiled graph out of the on-disk cache (38 s at every start, against 12.5 s
        # for a cached second start; docs/history/2026-11.md).
        cache = StaticCache(config=model.config, max_cache_len=bucket)
        name = cache_arg(model)

        def decode(tokens: Tensor, *padding: Tensor) -> Tensor:
            # The static cache knows the column it writes; padded rows say what they attend to and
            # where each one stands (tensors of fixed shapes: new values, not a new graph).
            rows = dict(zip(("attention_mask", "position_ids"), padding, strict=False))
            return model(input_ids=tokens, use_cache=True, **rows, **{name: cache}).logits[:, -1]

        graphs = uses_cuda_graphs(model.device)
        step = torch.compile(decode, dynamic=False, **({"mode": "reduce-overhead"} if graphs else {}))
        if graphs:
            step = replayed(step)
        start = time.perf_counter()
        # An ordinary tensor, like the loop's tokens: an inference-mode one would compile a second graph.
        dummy = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
        padding = warmup_padding(batch, bucket, model.device) if padded else ()
        try:
            with torch.inference_mode():
                decode(dummy, *padding)  # eagerly first: the cache allocates its tensors lazily, which would recompile
                # Compile now, so the first real token is not the slow one; CUDA graphs are recorded
                # at the second and run from the third call.
                for _ in range(3 if graphs else 1):
                    step(dummy, *padding)
                cache.reset()
        except Exception as exc:  # inductor needs a working C++ toolchain; say so instead of a traceback
            if out_of_memory(exc):
                raise RuntimeFailure(
                    f"out of memory while compiling the decode step on {model.device}; "
                    "run without --compile, or try --dtype bfloat16 or a smaller model"
                ) from exc
            raise UserError(f"--compile failed ({first_line(exc)}); run without --compile") from exc
        return CompiledStep(batch, bucket, cache, step, time.perf_counter() - start, padded)


def warmup_padding(batch: int, bucket: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """A padded step's mask and positions for compiling it: ordinary tensors of the run's shapes
    and dtypes (an inference-mode one, or another dtype, would compile a second graph)."""
    mask = torch.zeros(batch, bucket, dtype=torch.long, device=device)
    mask[:, :4] = 1  # the columns the warm-up calls write
    return mask, torch.zeros(batch, 1, dtype=torch.long, device=device)


def uses_cuda_graphs(device: torch.device) -> bool:
    """On CUDA the decode step is replayed as a CUDA graph (inductor's ``reduce-overhead``): a
    one-token step is hundreds of small kernels whose launches cost more than their work. The
    static cache keeps every address fixed, as a graph needs. CPU compiles as before."""
    return device.type == "cuda"


def replayed(graph: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A CUDA-graph step as the loops use it: each call is a new step (its inputs copied into the
    graph's own), and its logits are copied out, since the next replay overwrites the graph's
    output buffer while the loop (or a speculative rollback) may still hold the last one."""

    def step(tokens: Tensor, *padding: Tensor) -> Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return graph(tokens, *padding).clone()

    return step


def out_of_memory(exc: BaseException | None) -> bool:
    """Dynamo and inductor wrap what failed inside them (BackendCompilerFailed, ...): look down
    the chain, since running out of memory is a runtime failure (exit 1), not a usage error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
