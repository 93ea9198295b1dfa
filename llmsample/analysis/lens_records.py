"""``explain --layers``: the chosen next token and the model's top alternatives, their rank and
probability at every layer (the logit lens, :mod:`llmsample.engine.logit_lens`). The chosen token is
the one the preset's distribution favours (the sampler chain applied to the last layer's
logits, which are the model's own), so a ban or a constraint shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.analysis.explain import chain_report, constrained_history
from llmsample.engine.logit_lens import layer_logits
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.history import TokenHistory


@dataclass(frozen=True)
class LayerToken:
    token_id: int
    text: str
    ranks: list[int]  # per layer, embeddings first: 1 + the tokens with a larger logit
    probs: list[float]  # per layer: the softmax of that layer's read-out


@dataclass(frozen=True)
class LayerReport:
    layers: int  # the model's layers; each token has layers + 1 readings (the embeddings first)
    chosen: int  # token id: the preset's most likely next token
    tokens: list[LayerToken]  # the chosen one first, then the last layer's top alternatives

    def settles_at(self) -> int | None:
        """The first reading from which the chosen token stays rank 1 (None: not even at the end)."""
        ranks = self.tokens[0].ranks
        if ranks[-1] != 1:
            return None
        at = len(ranks) - 1
        while at > 0 and ranks[at - 1] == 1:
            at -= 1
        return at

    def to_dict(self) -> dict[str, Any]:
        return {"type": "layers", **asdict(self), "settles_at": self.settles_at()}


def layer_table(lens: Tensor, ids: Sequence[int], tokenizer_text: Any) -> list[LayerToken]:
    """Each token's rank and probability in every row of ``lens`` ``[readings, vocab]``."""
    probs = lens.softmax(-1)
    picked = lens[:, list(ids)]  # [readings, tokens]
    ranks = (lens[:, None, :] > picked[:, :, None]).sum(-1) + 1
    return [LayerToken(t, tokenizer_text(t), ranks[:, i].tolist(), probs[:, t].tolist()) for i, t in enumerate(ids)]


def explain_layers(
    lm: LoadedModel,
    prompt_ids: Tensor,
    cfg: SamplingConfig,
    top_n: int = 5,
    watch: Sequence[int] = (),
    fed: Sequence[int] = (),
) -> LayerReport:
    """The chosen token, ``top_n - 1`` alternatives (the last layer's most likely) and ``watch``,
    at the position after the prompt and ``fed`` (as written by the model: its penalties and
    grammar see them as :func:`score_continuation` does)."""
    lens = layer_logits(lm, [*prompt_ids[0].tolist(), *fed])
    history = TokenHistory.for_config(prompt_ids, lens.shape[-1], cfg, lm.tokenizer, lm.eos_ids)
    if fed:
        history = history.prefixes(torch.tensor(list(fed), device=prompt_ids.device), fed)
    history = constrained_history(lm, cfg, history, lens.shape[-1], fed).rows(slice(-1, None))
    chosen = chain_report(lens[-1:], history, cfg, lm.tokenizer, 1).candidates[0].token_id
    top = torch.topk(lens[-1], top_n).indices.tolist()
    ids = list(dict.fromkeys([chosen, *top]))[:top_n]
    ids += [t for t in dict.fromkeys(watch) if t not in ids]
    return LayerReport(lens.shape[0] - 1, chosen, layer_table(lens, ids, lm.token_text))
