"""What the token loop tells its renderers: one event per token, then a summary.

Renderers (plain, live colour, JSONL, HTML, inspection tables) read only these records;
none of them touches the model.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from llmsample.sampling.pipeline import entropy_bits

FILTER_STAGES = ("top_k", "top_p", "min_p")


@dataclass(frozen=True)
class Candidate:
    token_id: int
    text: str
    prob: float
    model_prob: float


@dataclass(frozen=True)
class TokenEvent:
    """``prob``: in the distribution the token was drawn from; ``model_*``: under the raw model
    (temperature 1, no penalties or filters); ``entropy``: of the sampling distribution, bits;
    ``removed``: candidates each filter removed at this step; ``text``: what this token released
    to the output (stop strings and split characters can delay text to a later token)."""

    index: int
    token_id: int
    text: str
    prob: float
    model_prob: float
    model_rank: int
    entropy: float
    top: tuple[Candidate, ...]
    removed: dict[str, int]
    source: str = "target"
    eos: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": "token", **asdict(self)}


@dataclass(frozen=True)
class Summary:
    text: str
    tokens: int
    prompt_tokens: int
    stop_reason: str  # eos | length | stop | interrupted
    ttft_s: float | None
    tokens_per_s: float | None
    model: str
    preset: str
    seed: int | None
    elapsed_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {"type": "summary", **asdict(self)}
        data.update(data.pop("extra"))
        return data


@dataclass
class RunStats:
    """Counts and clocks of one run, so a summary exists even when the run is cut short."""

    model: str
    preset: str
    seed: int | None
    prompt_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    tokens: int = 0
    text_parts: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self, event: TokenEvent) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.tokens += 1
        self.text_parts.append(event.text)

    def summary(self, stop_reason: str) -> Summary:
        now = time.perf_counter()
        ttft = None if self.first_token_at is None else self.first_token_at - self.started
        decode_time = None if self.first_token_at is None else now - self.first_token_at
        # Decode speed excludes the prefill, as llama.cpp and transformers' benchmarks count it.
        rate = (self.tokens - 1) / decode_time if decode_time and self.tokens > 1 else None
        return Summary(
            text="".join(self.text_parts),
            tokens=self.tokens,
            prompt_tokens=self.prompt_tokens,
            stop_reason=stop_reason,
            ttft_s=ttft,
            tokens_per_s=rate,
            model=self.model,
            preset=self.preset,
            seed=self.seed,
            elapsed_s=now - self.started,
            extra=dict(self.extra),
        )


@dataclass(frozen=True)
class StepFigures:
    """Per-row numbers of one sampling step, fetched from the device in a single transfer."""

    token_id: int
    prob: float
    model_prob: float
    model_rank: int
    entropy: float
    top_ids: list[int]
    top_probs: list[float]
    top_model_probs: list[float]
    removed: dict[str, int]
    mass: float  # total of the sampling distribution: 1 unless something overflowed
    finite_logits: bool  # the model's logits had no NaN/+inf and something finite


def step_figures(stages: list[tuple[str, Tensor]], probs: Tensor, tokens: Tensor, top_n: int) -> list[StepFigures]:
    """Everything a token event reports, for every row, with one host sync.

    The top list is ranked by the penalised logits: for kept tokens that is the order of the
    sampling distribution, and it still ranks the alternatives a greedy step discarded."""
    named = dict(stages)
    raw, ranked = named["raw"], named["penalties"]
    raw_logprobs = raw.log_softmax(-1)
    index = tokens.view(-1, 1)
    top_ids = ranked.topk(min(top_n, ranked.shape[-1]), dim=-1).indices if top_n > 0 else index[:, :0]
    kept: list[Tensor] = []
    for position, (_, logits) in enumerate(stages):
        # A stage that changed nothing returns its input: count it once. Logits are finite
        # (``check_finite``) until a filter sets -inf, so that is all there is to count.
        same = position > 0 and logits is stages[position - 1][1]
        kept.append(kept[-1] if same else (logits != -math.inf).sum(-1))
    columns = [
        index.float(),
        probs.gather(1, index),
        raw_logprobs.gather(1, index).exp(),
        (raw > raw.gather(1, index)).sum(-1, keepdim=True).float() + 1,
        entropy_bits(probs).unsqueeze(-1),
        probs.sum(-1, keepdim=True),
        # Checked here, in the step's one transfer, rather than with a host sync of its own.
        ((raw < math.inf).all(-1, keepdim=True) & (raw > -math.inf).any(-1, keepdim=True)).float(),
        torch.stack(kept, -1).float(),
        top_ids.float(),
        probs.gather(1, top_ids),
        raw_logprobs.gather(1, top_ids).exp(),
    ]
    rows = torch.cat(columns, -1).tolist()
    names = [name for name, _ in stages]
    n_stages, n_top = len(stages), top_ids.shape[-1]
    figures = []
    for row in rows:
        kept_counts = row[7 : 7 + n_stages]
        removed = {
            name: int(kept_counts[i - 1] - kept_counts[i]) for i, name in enumerate(names) if name in FILTER_STAGES
        }
        top = row[7 + n_stages :]
        figures.append(
            StepFigures(
                token_id=int(row[0]),
                prob=row[1],
                model_prob=row[2],
                model_rank=int(row[3]),
                entropy=max(row[4], 0.0) + 0.0,  # no -0.0 in the output
                top_ids=[int(t) for t in top[:n_top]],
                top_probs=top[n_top : 2 * n_top],
                top_model_probs=top[2 * n_top :],
                removed=removed,
                mass=row[5],
                finite_logits=row[6] == 1.0,
            )
        )
    return figures


def make_event(
    figures: StepFigures, index: int, text: str, tokenizer: Any, source: str = "target", eos: bool = False
) -> TokenEvent:
    top = tuple(
        Candidate(t, tokenizer.decode([t], skip_special_tokens=False), p, m)
        for t, p, m in zip(figures.top_ids, figures.top_probs, figures.top_model_probs, strict=True)
    )
    return TokenEvent(
        index=index,
        token_id=figures.token_id,
        text=text,
        prob=figures.prob,
        model_prob=figures.model_prob,
        model_rank=figures.model_rank,
        entropy=figures.entropy,
        top=top,
        removed=figures.removed,
        source=source,
        eos=eos,
    )
