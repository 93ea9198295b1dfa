"""Why a token: the sampler chain stage by stage for the next token, and teacher-forced scoring
of a given continuation. Both run the pipeline's own functions, never a copy of them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from llmsample.engine.runner import ModelRunner
from llmsample.models.loading import LoadedModel
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.pipeline import TokenHistory, entropy_bits, sampler_stages


@dataclass(frozen=True)
class StageCandidate:
    token_id: int
    text: str
    probs: dict[str, float]  # stage name -> probability after that stage (0 once removed)
    removed_by: str | None


@dataclass(frozen=True)
class ChainReport:
    stages: list[str]
    candidates: list[StageCandidate]
    kept: dict[str, int]  # stage -> candidates still allowed after it
    entropy: float  # of the final distribution, bits

    def to_dict(self) -> dict[str, Any]:
        return {"type": "chain", **asdict(self)}


@dataclass(frozen=True)
class ScoredToken:
    index: int
    token_id: int
    text: str
    model_prob: float
    prob: float  # under the preset's sampling distribution
    model_rank: int
    allowed: bool
    removed_by: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"type": "scored", **asdict(self)}


def _removed_by(stages: list[tuple[str, Tensor]], token: int) -> str | None:
    for name, logits in stages:
        if not torch.isfinite(logits[token]):
            return name
    return None


def chain_report(
    logits: Tensor, history: TokenHistory | None, cfg: SamplingConfig, tokenizer: Any, top_n: int = 10
) -> ChainReport:
    """``logits``: raw next-token logits ``[1, vocab]``."""
    stages = [(name, t[0]) for name, t in sampler_stages(logits, history, cfg)]
    probs = {name: t.softmax(-1) for name, t in stages}
    raw_top = stages[0][1].topk(top_n).indices.tolist()
    final_top = [t for t in stages[-1][1].topk(top_n).indices.tolist() if probs[stages[-1][0]][t] > 0]
    ids = list(dict.fromkeys(final_top + raw_top))[:top_n]
    candidates = [
        StageCandidate(
            token_id=t,
            text=tokenizer.decode([t], skip_special_tokens=False),
            probs={name: float(p[t]) for name, p in probs.items()},
            removed_by=_removed_by(stages, t),
        )
        for t in ids
    ]
    kept = {name: int(torch.isfinite(t).sum()) for name, t in stages}
    return ChainReport([name for name, _ in stages], candidates, kept, float(entropy_bits(probs[stages[-1][0]])))


def explain_next(lm: LoadedModel, prompt_ids: Tensor, cfg: SamplingConfig, top_n: int = 10) -> ChainReport:
    logits = ModelRunner(lm.model).prefill(prompt_ids)
    history = TokenHistory.start(prompt_ids, logits.shape[-1]) if cfg.has_penalties else None
    return chain_report(logits, history, cfg, lm.tokenizer, top_n)


def score_continuation(
    lm: LoadedModel, prompt_ids: Tensor, continuation: list[int], cfg: SamplingConfig
) -> list[ScoredToken]:
    """Teacher forcing: one forward pass over prompt + continuation, then each continuation token's
    probability under the raw model and under the preset (penalties see the tokens before it)."""
    runner = ModelRunner(lm.model)
    runner.reset()
    cont = torch.tensor(continuation, device=prompt_ids.device)
    logits = runner.extend(torch.cat([prompt_ids[0], cont])[None])[0, prompt_ids.shape[1] - 1 : -1]
    history = None
    if cfg.has_penalties:  # row i sees the continuation before token i
        rows = TokenHistory.start(prompt_ids, logits.shape[-1]).prefixes(cont)
        history = TokenHistory(rows.counts[:-1], rows.seen[:-1])
    stages = sampler_stages(logits, history, cfg)
    raw, final = stages[0][1], stages[-1][1]
    model_probs, preset_probs = raw.softmax(-1), final.softmax(-1)
    scored = []
    for i, token in enumerate(continuation):
        rows = [(name, t[i]) for name, t in stages]
        scored.append(
            ScoredToken(
                index=i,
                token_id=token,
                text=lm.tokenizer.decode([token], skip_special_tokens=False),
                model_prob=float(model_probs[i, token]),
                prob=float(preset_probs[i, token]),
                model_rank=int((raw[i] > raw[i, token]).sum()) + 1,
                allowed=bool(torch.isfinite(final[i, token])),
                removed_by=_removed_by(rows, token),
            )
        )
    return scored
