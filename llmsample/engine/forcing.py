"""Teacher forcing through the engine's seam (:mod:`llmsample.engine.backend`): a given text's
next-token logits at every position, on whichever backend the model runs (``explain``,
``compare-models``, chat ``/explain``). A row is admitted and the text verified in one pass
(logits at each position), so every backend that decodes also scores, and no command runs the
model beside the seam."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from llmsample.engine.backend import open_backend
from llmsample.models.loading import LoadedModel


def forced_logits(lm: LoadedModel, prompt: Sequence[int], fed: Sequence[int] = ()) -> Tensor:
    """Raw logits ``[1 + len(fed), vocab]`` on the model's sample device: row 0 after ``prompt``,
    row i after the prompt and ``fed``'s first i tokens. The backend is opened for this text
    alone and closed (llama.cpp decodes a long text in batches, copying each one's logits out).

    With ``fed``, the whole text is verified in one pass on a row emptied first (admitted with
    its first token, rolled back to nothing): the numbers of the model's own forward pass over
    the text, to the last bit, where a prompt admitted apart would round differently."""
    backend = open_backend(lm, 1, len(prompt) + len(fed), one_prompt=True, steps=False)
    try:
        if not fed:
            return backend.admit([list(prompt)])
        text = [*prompt, *fed]
        backend.admit([text[:1]])
        backend.rollback(0, 0)
        return backend.verify([text])[0, len(prompt) - 1 :].clone()  # not the prompt's rows kept alive
    finally:
        backend.close()
