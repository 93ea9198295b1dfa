"""What ``compare-models`` tells its renderers: one record per scored token, then a summary.
Plain data, no torch (like :mod:`llmsample.events`), so the views stay torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

KL_UNIT = "nats"
MOST_DIVERGENT = 5


@dataclass(frozen=True)
class TopToken:
    """A model's most likely token at one position and its probability under that model."""

    token_id: int
    text: str
    prob: float


@dataclass(frozen=True)
class DriftToken:
    """One continuation token scored under both models (raw distributions: temperature 1, no
    penalties or filters). ``kl``: KL(A‖B) of the two next-token distributions at this position,
    in nats; ``same_top``: whether both models' most likely tokens agree; ``text``: what this
    token adds to the continuation's text (the texts concatenate to it)."""

    index: int
    token_id: int
    text: str
    prob_a: float
    prob_b: float
    kl: float
    same_top: bool
    top_a: TopToken
    top_b: TopToken

    def to_dict(self) -> dict[str, Any]:
        return {"type": "drift", **asdict(self)}


@dataclass(frozen=True)
class Divergent:
    index: int
    token_id: int
    text: str
    kl: float


@dataclass(frozen=True)
class DriftSummary:
    """``expected_acceptance``: Σ_x min(p_A(x), p_B(x)) averaged over the positions, the chance
    that a token B drafts is accepted by A in speculative decoding (raw distributions)."""

    model_a: str
    model_b: str
    source: str  # "generated" (by A) or "given" (--continuation)
    tokens: int
    prompt_tokens: int
    vocab: int  # the shared vocabulary the distributions are compared on
    mean_kl: float
    max_kl: float
    same_top_rate: float  # 0..1
    expected_acceptance: float  # 0..1
    most_divergent: list[Divergent]
    kl_unit: str = KL_UNIT
    extra: dict[str, Any] = field(default_factory=dict)  # generated: preset, seed, stop_reason

    def to_dict(self) -> dict[str, Any]:
        data = {"type": "summary", **asdict(self)}
        data.update(data.pop("extra"))
        return data


def summarize(
    tokens: Sequence[DriftToken],
    acceptance: Sequence[float],
    *,
    model_a: str,
    model_b: str,
    source: str,
    prompt_tokens: int,
    vocab: int,
    extra: dict[str, Any] | None = None,
) -> DriftSummary:
    """The summary of a non-empty run; ``acceptance[i]``: Σ_x min(p_A, p_B) at position i."""
    if not tokens or len(tokens) != len(acceptance):
        raise ValueError("summarize needs one acceptance figure per token, and at least one token")
    n = len(tokens)
    ranked = sorted(tokens, key=lambda t: (-t.kl, t.index))[:MOST_DIVERGENT]
    return DriftSummary(
        model_a=model_a,
        model_b=model_b,
        source=source,
        tokens=n,
        prompt_tokens=prompt_tokens,
        vocab=vocab,
        mean_kl=sum(t.kl for t in tokens) / n,
        max_kl=max(t.kl for t in tokens),
        same_top_rate=sum(t.same_top for t in tokens) / n,
        expected_acceptance=sum(acceptance) / n,
        most_divergent=[Divergent(t.index, t.token_id, t.text, t.kl) for t in ranked],
        extra=dict(extra or {}),
    )
