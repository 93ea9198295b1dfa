"""What a sweep measures of each sample and of each prompt's samples across seeds, from the
records ``batch`` writes (``--tokens full``) alone: every formula is in ``docs/sampling.md``.

Quality: the text's mean log-probability under the model at temperature 1 (the record's
``model_prob``), and under a judge model. Diversity: distinct-n and self-BLEU across the seeds
of one prompt, and the entropy of the distributions the tokens were drawn from. Failures:
repeated n-grams, loops, early ends, and text not in the prompt's language."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmsample.analysis.text_metrics import cross_sample_diversity, mean_logprob, ngrams
from llmsample.errors import UserError

REPEAT_N = 4
"""A sample *repeats* when an n-gram of this many tokens (or more) occurs twice in it."""

LOOP_SPAN = 32
LOOP_TIMES = 3
"""A sample *loops* when it ends in a span of at most ``LOOP_SPAN`` tokens written
``LOOP_TIMES`` times or more back to back (the degenerate repetition of Holtzman et al. 2020)."""

EARLY_SHARE = 0.1
"""A sample *ends early* when end of text (or a stop) came before this share of its max tokens."""

MIN_WORDS = 3
MIN_SHARE = 0.2
"""Fewer words than ``MIN_WORDS``, or no language given ``MIN_SHARE`` of the probability: too
little to tell the text's language (not counted either way)."""


@dataclass(frozen=True)
class SampleMetrics:
    """One sample's numbers; None where not measured (a sample of no tokens has no
    log-probability or entropy: 0 would be the best score there is)."""

    tokens: int
    logprob: float | None
    entropy: float | None
    repeats: bool
    loops: bool
    early_end: bool
    language: str | None
    off_language: bool | None
    judge_logprob: float | None = None


def repeats(ids: Sequence[int], n: int = REPEAT_N) -> bool:
    """Whether some n-gram of ``n`` tokens occurs twice (a longer repeated one contains one)."""
    grams = ngrams(ids, n)
    return len(set(grams)) < len(grams)


def loops(ids: Sequence[int], span: int = LOOP_SPAN, times: int = LOOP_TIMES) -> bool:
    """Whether the tokens end in one span of at most ``span`` tokens, ``times`` times in a row."""
    for length in range(1, min(span, len(ids) // times) + 1):
        tail = list(ids[-length:])
        if all(list(ids[len(ids) - k * length : len(ids) - (k - 1) * length]) == tail for k in range(2, times + 1)):
            return True
    return False


def ended_early(stop_reason: str | None, tokens: int, max_tokens: int, share: float = EARLY_SHARE) -> bool:
    """End of text or a stop string before ``share`` of the allowed tokens (a length or context
    end never is)."""
    return stop_reason in ("eos", "stop") and tokens < share * max_tokens


def sample_metrics(
    record: dict[str, Any], max_tokens: int, language: str | None, detect: Callable[[str], str | None]
) -> SampleMetrics:
    """A ``batch`` record's numbers (its ``per_token`` with ``model_prob`` and ``entropy``);
    ``language``: the one its text should be in (None: not measured)."""
    per_token = record.get("per_token") or []
    ids = [token["token_id"] for token in per_token]
    found = detect(record.get("text", ""))
    off = None if found is None or language is None else found != language
    return SampleMetrics(
        tokens=record.get("tokens", len(ids)),
        logprob=mean_logprob([token["model_prob"] for token in per_token]) if per_token else None,
        entropy=sum(token["entropy"] for token in per_token) / len(per_token) if per_token else None,
        repeats=repeats(ids),
        loops=loops(ids),
        early_end=ended_early(record.get("stop_reason"), record.get("tokens", len(ids)), max_tokens),
        language=found,
        off_language=off,
    )


def distinct(samples: Sequence[Sequence[int]], n: int) -> float:
    """distinct-n across the samples of one prompt (Li et al. 2016): unique n-grams over all."""
    return cross_sample_diversity(samples, n)


def self_bleu(samples: Sequence[Sequence[int]]) -> float | None:
    """Mean BLEU-4 of each sample against the others as references (Zhu et al. 2018, Texygen),
    on the model's tokens, in [0, 1]: 1 when every sample is the same text. sacrebleu's sentence
    BLEU (its default ``exp`` smoothing, no tokenizer: the ids are the words). None for fewer
    than two samples."""
    from sacrebleu.metrics import BLEU

    if len(samples) < 2:
        return None
    bleu = BLEU(tokenize="none", effective_order=True)
    words = [" ".join(map(str, ids)) for ids in samples]
    scores = [bleu.sentence_score(words[i], words[:i] + words[i + 1 :]).score for i in range(len(words))]
    return sum(scores) / len(scores) / 100


def detector(expected: str | None = None) -> Callable[[str], str | None]:
    """The text's language (ISO 639-1) by py3langid's bundled model; None where it cannot tell:
    fewer than :data:`MIN_WORDS` words, or no language above :data:`MIN_SHARE` of the
    probability (a short English list of fruit reads as Tagalog at 0.06; a plain English
    sentence is English at 0.29). ``expected``: a language the user named, one line if the
    model does not know it."""
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_modelpath(MODEL_DIR / MODEL_FILE, norm_probs=True)
    if expected is not None and expected not in identifier.nb_classes:
        raise UserError(f"--language {expected!r}: not a language code py3langid knows (en, fr, de, zh, ...)")

    def detect(text: str) -> str | None:
        if len(text.split()) < MIN_WORDS:
            return None
        language, share = identifier.classify(text)
        return str(language) if share >= MIN_SHARE else None

    return detect


@dataclass(frozen=True)
class Interval:
    """A mean with its 95 % interval under the normal approximation (mean ± 1.96 standard
    errors; ``half`` 0 for one value), over ``n`` values."""

    mean: float
    half: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.mean - self.half, "high": self.mean + self.half, "n": self.n}


def interval(values: Sequence[float]) -> Interval | None:
    """None for no values."""
    if not values:
        return None
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(mean, 0.0, 1)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return Interval(mean, 1.96 * math.sqrt(variance / n), n)
