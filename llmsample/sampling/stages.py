"""The stages of the sampler chain, in chain order: one table that the pipeline, the history, the
step figures, ``explain``, ``--inspect`` and the HTML page all read, so a new stage is one row
here (and its function in the pipeline's ``APPLY``) instead of an edit in five places. It reads
the config, never the other way round.

Plain data (no torch): the renderers read it too."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmsample.sampling.config import SAMPLER_ORDER

if TYPE_CHECKING:
    from llmsample.sampling.config import SamplingConfig


@dataclass(frozen=True)
class StageInfo:
    """One stage. ``removes``: a filter, whose removed candidates every token event counts under
    ``name`` and ``--inspect`` under ``letter`` (``legend`` says what the letter stands for).
    Greedy keeps one token but is not a filter: a greedy step reports nothing removed.
    ``needs_sequences``: it reads each row's token sequence (the order, not only the penalties'
    counts); ``needs_vocabulary``: the tokenizer's texts or EOS ids; ``carries``: it keeps
    per-row state from the row's draws (:mod:`llmsample.sampling.carried`)."""

    name: str
    label: str
    on: Callable[[SamplingConfig], bool]
    removes: bool = False
    letter: str = ""
    legend: str = ""
    needs_sequences: bool = False
    needs_vocabulary: bool = False
    carries: bool = False


def _always(cfg: SamplingConfig) -> bool:
    return True


def _sampling(cfg: SamplingConfig) -> bool:
    return not cfg.is_greedy


STAGES: tuple[StageInfo, ...] = (
    StageInfo("raw", "raw", _always),
    StageInfo("logit_bias", "bias", lambda cfg: bool(cfg.logit_bias), needs_vocabulary=True),
    StageInfo(
        "ban", "ban", lambda cfg: bool(cfg.ban), removes=True, letter="b", legend="--ban",
        needs_sequences=True, needs_vocabulary=True,
    ),
    StageInfo(
        "min_tokens", "min-n", lambda cfg: cfg.min_tokens > 0, removes=True, letter="n", legend="--min-tokens",
        needs_sequences=True, needs_vocabulary=True,
    ),
    StageInfo(
        "no_repeat_ngram", "n-gram", lambda cfg: cfg.no_repeat_ngram_size > 0, removes=True, letter="r",
        legend="--no-repeat-ngram-size", needs_sequences=True,
    ),
    StageInfo(
        "reasoning_budget", "think", lambda cfg: cfg.reasoning_budget > 0, removes=True, letter="f",
        legend="--reasoning-budget, closing the thinking block", needs_sequences=True, needs_vocabulary=True,
    ),
    StageInfo("penalties", "penal.", _always),
    StageInfo("dry", "DRY", lambda cfg: cfg.has_dry, needs_sequences=True, needs_vocabulary=True),
    StageInfo(
        "constraint", "gramm.", lambda cfg: cfg.constraint is not None, removes=True, letter="g",
        legend="the constraint (--json, --json-schema, --regex, --choice, --grammar)",
    ),
    StageInfo("greedy", "greedy", lambda cfg: cfg.is_greedy),
    StageInfo("temperature", "temp.", _sampling),
    StageInfo("smoothing", "smooth", lambda cfg: _sampling(cfg) and cfg.smoothing_factor > 0),
    StageInfo(
        "top_n_sigma", "n-σ", lambda cfg: _sampling(cfg) and cfg.top_n_sigma > 0, removes=True, letter="σ",
        legend="top-n-sigma",
    ),
    StageInfo("top_k", "top-k", _sampling, removes=True, letter="k", legend="top-k"),
    StageInfo("top_p", "top-p", _sampling, removes=True, letter="p", legend="top-p"),
    StageInfo(
        "typical_p", "typ.", lambda cfg: _sampling(cfg) and cfg.typical_p < 1, removes=True, letter="t",
        legend="typical-p",
    ),
    StageInfo(
        "epsilon", "eps.", lambda cfg: _sampling(cfg) and cfg.epsilon_cutoff > 0, removes=True, letter="e",
        legend="epsilon cutoff",
    ),
    StageInfo(
        "eta", "eta", lambda cfg: _sampling(cfg) and cfg.eta_cutoff > 0, removes=True, letter="η",
        legend="eta cutoff",
    ),
    StageInfo(
        "top_h", "top-h", lambda cfg: _sampling(cfg) and cfg.top_h > 0, removes=True, letter="h", legend="top-h",
    ),
    StageInfo(
        "top_a", "top-a", lambda cfg: _sampling(cfg) and cfg.top_a > 0, removes=True, letter="a", legend="top-a",
    ),
    StageInfo("p_less", "p-less", lambda cfg: _sampling(cfg) and cfg.p_less, removes=True, letter="l", legend="p-less"),
    StageInfo("min_p", "min-p", _sampling, removes=True, letter="m", legend="min-p"),
    StageInfo(
        "xtc", "XTC", lambda cfg: _sampling(cfg) and cfg.has_xtc, removes=True, letter="x",
        legend="XTC, when it fires",
    ),
    StageInfo(
        "mirostat", "miro.", lambda cfg: _sampling(cfg) and cfg.mirostat > 0, removes=True, letter="μ",
        legend="mirostat (above its surprise mu)", carries=True,
    ),
    StageInfo("adaptive_p", "adapt-p", lambda cfg: _sampling(cfg) and cfg.has_adaptive_p, carries=True),
)  # fmt: skip
"""Every stage in chain order; ``on`` says whether a config's chain has it (an off stage is not
in the chain at all; top-k, top-p and min-p are, set to keep everything, when sampling)."""

BY_NAME: dict[str, StageInfo] = {info.name: info for info in STAGES}

FILTER_STAGES: tuple[str, ...] = tuple(info.name for info in STAGES if info.removes)
"""The stages that remove candidates; the step figures count what each removed (XTC: what it
removes on the steps it fires)."""


def label(name: str) -> str:
    """How the tables and the HTML view name a stage."""
    return BY_NAME[name].label


@functools.lru_cache(maxsize=256)
def chain_of(cfg: SamplingConfig) -> tuple[StageInfo, ...]:
    """The stages a config's chain runs, in order (``raw`` first): the table's, or with
    ``samplers`` the history stages in the table's order and then the listed ones in theirs.
    Mirostat replaces the stages after the temperature (llama.cpp's chain: temperature, mirostat).
    Remembered per config (a frozen value): every step asks, and walking the table costs a
    hash's four times."""
    chain = tuple(info for info in STAGES if info.on(cfg))
    if cfg.mirostat and not cfg.is_greedy:
        return tuple(info for info in chain if info.name not in SAMPLER_ORDER or info.name == "temperature")
    if not cfg.samplers or cfg.is_greedy:
        return chain
    history = tuple(info for info in chain if info.name not in SAMPLER_ORDER)
    return history + tuple(BY_NAME[name] for name in cfg.samplers if BY_NAME[name].on(cfg))


def needs_sequences(cfg: SamplingConfig) -> bool:
    """Whether ``cfg``'s chain reads the token sequence itself (DRY, bans, min-tokens), not only counts."""
    return any(info.needs_sequences and info.on(cfg) for info in STAGES)


def needs_vocabulary(cfg: SamplingConfig) -> bool:
    """Whether ``cfg``'s chain needs the tokenizer: token texts, EOS ids, texts to token ids."""
    return any(info.needs_vocabulary and info.on(cfg) for info in STAGES)
