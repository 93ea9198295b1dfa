"""``explain --tree``: the most likely continuations of a prompt as a tree, expanded through the
engine's seam (:mod:`llmsample.engine.backend`) on any backend that verifies and rolls back: the
prompt is admitted once, each branch verified one token on from its parent and rolled back
after its subtree (depth first), so every node costs one one-token forward pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from llmsample.engine.backend import Backend, open_backend
from llmsample.models.loading import LoadedModel
from llmsample.sampling import blocks


@dataclass(frozen=True)
class Branch:
    token_id: int
    text: str
    prob: float  # the model's, given the prompt and the branches above
    path_prob: float  # the product along the path from the prompt
    children: list[Branch] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "token_id": self.token_id,
            "text": self.text,
            "prob": self.prob,
            "path_prob": self.path_prob,
            "children": [child.to_dict() for child in self.children],
        }


def continuation_tree(lm: LoadedModel, prompt: list[int], depth: int, width: int) -> list[Branch]:
    """The ``width`` most likely next tokens (the model's own probabilities), each with its
    ``width`` most likely followers, ``depth`` tokens deep: ``width + … + width**depth`` nodes,
    one forward pass per node above the last level."""
    backend = open_backend(lm, 1, len(prompt) + depth, one_prompt=True, steps=False)
    try:
        return _branches(lm, backend, backend.admit([prompt])[0], len(prompt), depth, width, 1.0)
    finally:
        backend.close()


def _branches(
    lm: LoadedModel, backend: Backend, logits: Tensor, length: int, depth: int, width: int, above: float
) -> list[Branch]:
    """The branches after a row of ``length`` cached tokens whose next-token ``logits`` these are."""
    probs = logits.softmax(-1)
    branches = []
    for token in blocks.top(logits[None], width)[1][0].tolist():
        prob = float(probs[token])
        children = []
        if depth > 1:
            after = backend.verify([[token]])[0, 0]
            children = _branches(lm, backend, after, length + 1, depth - 1, width, above * prob)
            backend.rollback(0, length)
        branches.append(Branch(token, lm.token_text(token), prob, above * prob, children))
    return branches
