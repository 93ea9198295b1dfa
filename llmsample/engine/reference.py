"""``generate --reference``: what quantization (or a lower precision) did to the distribution.

A reference model (the same checkpoint in full precision) decodes the same tokens in lockstep
with its own KV cache; at every step its raw distribution is compared with the model's, before
any penalty, temperature or filter: KL(P_ref ‖ P_model) in nats, whether both rank the same token
first, and the sampled token's reference probability (the figures llama.cpp's perplexity tool
reports as mean KLD and "same top p")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from llmsample.events import ReferenceFigures, ReferenceSummary


@dataclass
class ReferenceTotals:
    """Running figures of one row, for its summary."""

    dtype: str
    tokens: int = 0
    kl_sum: float = 0.0
    same_top: int = 0
    kl_max: float = 0.0

    def add(self, figures: ReferenceFigures) -> None:
        self.tokens += 1
        self.kl_sum += figures.kl
        self.same_top += figures.same_top
        self.kl_max = max(self.kl_max, figures.kl)

    def summary(self) -> ReferenceSummary:
        n = max(self.tokens, 1)
        return ReferenceSummary(self.dtype, self.tokens, self.kl_sum / n, self.kl_max, self.same_top / n)


def reference_figures(model_logits: Tensor, reference_logits: Tensor, tokens: Tensor) -> list[ReferenceFigures]:
    """Per row: KL(P_ref ‖ P_model) over the raw distributions, same argmax, P_ref(token); one transfer."""
    reference_logits = reference_logits.to(model_logits.device).float()
    vocab = min(model_logits.shape[-1], reference_logits.shape[-1])  # embedding padding may differ
    log_p = reference_logits[:, :vocab].log_softmax(-1)
    log_q = model_logits[:, :vocab].float().log_softmax(-1)
    p = log_p.exp()
    kl = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1).clamp_min(0)
    same = log_p.argmax(-1) == log_q.argmax(-1)
    prob = p.gather(-1, tokens.view(-1, 1).to(p.device).clamp_max(vocab - 1)).squeeze(-1)
    rows = torch.stack([kl, same.float(), prob], -1).tolist()
    return [ReferenceFigures(kl=row[0] + 0.0, same_top=bool(row[1]), prob=row[2]) for row in rows]
