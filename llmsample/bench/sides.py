"""The two sides of a single-stream run: our token loop (``ours``) and transformers' ``generate``
(``theirs``) on the same model, prompt and settings, EOS ignored on both, each returning the
tokens it made."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from llmsample.engine.loop import generate
from llmsample.events import RunStats, Summary
from llmsample.models import attention
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig


def ours(
    lm: LoadedModel,
    ids: torch.Tensor,
    cfg: SamplingConfig,
    renderer: Any = None,
    ttft: list[float] | None = None,
    extra: dict[str, Any] | None = None,
) -> int:
    """Our loop; ``renderer`` is told every record (the inspection cost), ``ttft`` and ``extra``
    collect the summary's time to first token and run facts."""
    count = 0
    for item in generate(lm, ids, cfg, RunStats(lm.name, "bench", cfg.seed), ignore_eos=True):
        if isinstance(item, Summary):
            if ttft is not None and item.ttft_s is not None:
                ttft.append(item.ttft_s)
            if extra is not None:
                extra.update(item.facts.to_dict())
            if renderer:
                renderer.summary(item)
        else:
            count += 1
            if renderer:
                renderer.token(item)
    return count


@contextlib.contextmanager
def stock_attention(model: Any) -> Iterator[None]:
    """The reference runs transformers' own SDPA: ``--compile`` switches the shared model to
    ``llmsample.models.attention`` (switching back to the same name later needs no recompilation)."""
    current = model.config._attn_implementation
    if current != attention.NAME:
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(current)


def theirs(lm: LoadedModel, ids: torch.Tensor, cfg: SamplingConfig, **extra: Any) -> int:
    """transformers' ``generate`` with the same settings (``extra``: more of its keywords)."""
    sampling = (
        {}
        if cfg.is_greedy
        else {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p}
    )
    with torch.inference_mode(), stock_attention(lm.model):
        out = lm.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=cfg.max_tokens,
            min_new_tokens=cfg.max_tokens,  # EOS ignored, as on our side
            pad_token_id=lm.tokenizer.eos_token_id,
            **({"do_sample": False} if cfg.is_greedy else sampling),
            **extra,
        )
    return out.shape[1] - ids.shape[1]


def reference_model(model: str | None, device: torch.device, dtype: torch.dtype | None) -> Any:
    """The model as a transformers user loads it: ``from_pretrained`` at ``dtype``, or at its own
    default when None (float32 before transformers 5; the config's dtype, ``"auto"``, since)."""
    from transformers import AutoModelForCausalLM

    from llmsample.models.gguf_to_hf import default_model_path
    from llmsample.models.loading import read_config

    source = default_model_path() if model is None else model
    config = read_config(source, model or "default")  # without an old conversion's GGUF quantization entry
    kwargs = {} if dtype is None else {"dtype": dtype}
    return AutoModelForCausalLM.from_pretrained(source, config=config, **kwargs).to(device).eval()


def as_transformers_loads(lm: LoadedModel, model: str | None, dtype: torch.dtype | None) -> LoadedModel:
    """``lm`` with the model as transformers' users load it (``from_pretrained`` at ``dtype``, its
    own default when None): no reordered weights, eager."""
    # The folder our load read (a GGUF converted, a hub id resolved), not the spec as typed.
    reference = reference_model(getattr(lm.model, "name_or_path", None) or model, lm.device, dtype)
    return dataclasses.replace(lm, model=reference, dtype=reference.dtype, compiled=None)
