"""Teacher forcing through the engine's seam (:mod:`llmsample.engine.backend`): a given text's
next-token logits at every position, on whichever backend the model runs (``explain``,
``compare-models``, chat ``/explain``). The prompt is admitted as a row (its last position's
logits) and the tokens after it verified in one pass (logits at each), so every backend that
decodes also scores, and no command runs the model beside the seam."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from llmsample.engine.backend import open_backend
from llmsample.models.loading import LoadedModel


def forced_logits(lm: LoadedModel, prompt: Sequence[int], fed: Sequence[int] = ()) -> Tensor:
    """Raw logits ``[1 + len(fed), vocab]`` on the model's sample device: row 0 after ``prompt``,
    row i after the prompt and ``fed``'s first i tokens. The backend is opened for this text
    alone and closed (llama.cpp decodes a long ``fed`` in batches, copying each one's logits out)."""
    backend = open_backend(lm, 1, len(prompt) + len(fed), one_prompt=True, steps=False)
    try:
        rows = [backend.admit([list(prompt)])]
        if fed:
            rows.append(backend.verify([list(fed)])[0])
    finally:
        backend.close()
    return rows[0] if len(rows) == 1 else torch.cat(rows)
