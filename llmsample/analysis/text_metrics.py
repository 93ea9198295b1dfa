"""Text-quality numbers for comparing presets, computed from token events alone."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmsample.events import Summary, TokenEvent


def ngrams(tokens: Sequence[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(tokens: Sequence[int], n: int) -> float:
    """Unique n-grams over all n-grams (Li et al. 2016); 0 for text shorter than n."""
    grams = ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition_rate(tokens: Sequence[int], n: int = 4) -> float:
    """Share of n-grams that repeat an earlier one."""
    grams = ngrams(tokens, n)
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def mean_logprob(model_probs: Sequence[float]) -> float:
    """Mean natural-log probability of the tokens under the raw model."""
    if not model_probs:
        return 0.0
    return sum(math.log(max(p, 1e-45)) for p in model_probs) / len(model_probs)


def perplexity(logprob: float) -> float:
    return math.exp(-logprob)


def divergence_index(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """First position where ``tokens`` departs from ``reference`` (the greedy text); None if never."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def cross_sample_diversity(samples: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams across all samples over all their n-grams: 1/len(samples) when identical."""
    grams = [g for tokens in samples for g in ngrams(tokens, n)]
    return len(set(grams)) / len(grams) if grams else 0.0


def mean_pairwise_overlap(samples: Sequence[Sequence[int]], n: int = 2) -> float:
    """Mean Jaccard overlap of the samples' n-gram sets (1: identical, 0: nothing shared)."""
    pairs = list(itertools.combinations([set(ngrams(t, n)) for t in samples], 2))
    if not pairs:
        return 1.0
    return sum(len(a & b) / len(a | b) if a | b else 1.0 for a, b in pairs) / len(pairs)


@dataclass(frozen=True)
class SampleMetrics:
    preset: str
    sample: int
    seed: int | None
    text: str
    tokens: int
    tokens_per_s: float | None
    mean_logprob: float
    perplexity: float
    mean_entropy: float
    distinct_1: float
    distinct_2: float
    repetition_rate: float
    divergence_index: int | None


def sample_metrics(
    preset: str, sample: int, events: list[TokenEvent], summary: Summary, greedy: Sequence[int]
) -> SampleMetrics:
    ids = [e.token_id for e in events]
    logprob = mean_logprob([e.model_prob for e in events])
    return SampleMetrics(
        preset=preset,
        sample=sample,
        seed=summary.seed,
        text=summary.text,
        tokens=summary.tokens,
        tokens_per_s=summary.tokens_per_s,
        mean_logprob=logprob,
        perplexity=perplexity(logprob),
        mean_entropy=sum(e.entropy for e in events) / len(events) if events else 0.0,
        distinct_1=distinct_n(ids, 1),
        distinct_2=distinct_n(ids, 2),
        repetition_rate=repetition_rate(ids),
        divergence_index=divergence_index(ids, greedy),
    )
