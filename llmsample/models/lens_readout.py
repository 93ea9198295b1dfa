"""The logit lens: a layer's residual stream read out through the model's own final norm and
head, as if the layers after it were skipped. Found on any transformers causal LM that ends in
a named final norm and an output embedding; the last layer's reading is the model's own logits.

``output_hidden_states`` gives the embeddings and every layer's output, except that the last
entry is already normed: the norm's own input is recorded instead, so every stream goes
through the norm exactly once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_layer_norm")  # Llama/Qwen, Phi, GPT-2, OPT


def final_norm(model: Any) -> torch.nn.Module | None:
    """The norm between the last layer and the head, by the names the model families give it."""
    base = model.base_model
    for holder in (base, getattr(base, "decoder", None)):
        for name in NORM_NAMES:
            module = getattr(holder, name, None)
            if isinstance(module, torch.nn.Module):
                return module
    return None


@contextlib.contextmanager
def norm_inputs(model: Any) -> Iterator[list[Tensor]]:
    """Inside, each input the final norm sees is appended to the yielded list."""
    norm = final_norm(model)
    if norm is None:
        raise ValueError("the model has no final norm by a known name")
    seen: list[Tensor] = []
    handle = norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        yield seen
    finally:
        handle.remove()


def read_out(model: Any, streams: Sequence[Tensor]) -> Tensor:
    """Each stream ``[1, 1, hidden]`` through the final norm and the head, one at a time (the
    shape the model's own head sees with one position kept, so the last layer's numbers are
    the model's to the bit): float32 logits ``[len(streams), vocab]``. The last stream is the
    norm's own input, so on the norm's device (``--device-map``): the others go there."""
    norm, head = final_norm(model), model.get_output_embeddings()
    if norm is None or head is None:
        raise ValueError("the model has no final norm or output embedding to read its layers through")
    device = streams[-1].device
    with torch.inference_mode():
        return torch.cat([head(norm(stream.to(device))).float()[0] for stream in streams])
