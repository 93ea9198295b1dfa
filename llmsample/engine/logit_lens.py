"""``explain --layers`` through the engine's seam (:mod:`llmsample.engine.backend`): a prompt's
next-token logits as each layer would give them (the logit lens), on a backend that can expose
its layers; the others are refused in one line."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from llmsample.engine.backend import open_backend
from llmsample.errors import UserError
from llmsample.models.loading import LoadedModel
from llmsample.models.plan import ON_LLAMA_CPP


def layer_logits(lm: LoadedModel, prompt: Sequence[int]) -> Tensor:
    """``[layers + 1, vocab]`` float32 on the sample device: row 0 the embeddings read through
    the final norm and the head, row i the residual stream after layer i, the last row the
    model's own next-token logits."""
    if lm.backend == "llama.cpp":
        raise UserError(ON_LLAMA_CPP)
    backend = open_backend(lm, 1, len(prompt), one_prompt=True, steps=False)
    try:
        if backend.layers is None:
            raise UserError(
                f"--layers reads the layers on the padded batch; {lm.name!r} runs here on "
                f"{type(backend).__name__} (--tp, or a cache it cannot pad), which does not expose them"
            )
        return backend.layers.admit_layers(list(prompt))
    finally:
        backend.close()
