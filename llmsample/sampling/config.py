"""Decoding settings: one validated, frozen object shared by presets, flags and the loop."""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

GREEDY_TEMPERATURE = 1e-4
"""At or below this temperature we take the argmax instead of dividing by ~0."""


class ConfigError(ValueError):
    """A setting out of range or of the wrong type; the message names the key and the range.
    ``key`` and ``reason`` are kept apart so callers can name the key their own way (a flag)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(key, f"must be finite, got {value!r}")
    return float(value)


def _integer(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"expected an integer, got {value!r}")
    return value


def _check_temperature(value: Any) -> float:
    v = _number("temperature", value)
    if v < 0:
        raise ConfigError("temperature", f"must be >= 0 (0 means greedy), got {value!r}")
    return v


def _check_top_k(value: Any) -> int:
    v = _integer("top_k", value)
    if v < 0:
        raise ConfigError("top_k", f"must be an integer >= 0 (0 turns it off), got {value!r}")
    return v


def _check_top_p(value: Any) -> float:
    v = _number("top_p", value)
    if not 0 < v <= 1:
        raise ConfigError("top_p", f"must be in (0, 1] (1 turns it off), got {value!r}")
    return v


def _check_min_p(value: Any) -> float:
    v = _number("min_p", value)
    if not 0 <= v <= 1:
        raise ConfigError("min_p", f"must be in [0, 1] (0 turns it off), got {value!r}")
    return v


def _check_penalty(key: str) -> Any:
    def check(value: Any) -> float:
        v = _number(key, value)
        if not -2 <= v <= 2:
            raise ConfigError(key, f"must be in [-2, 2] (0 turns it off), got {value!r}")
        return v

    return check


def _check_repetition_penalty(value: Any) -> float:
    v = _number("repetition_penalty", value)
    if v <= 0:
        raise ConfigError("repetition_penalty", f"must be > 0 (1 turns it off), got {value!r}")
    return v


def _check_max_tokens(value: Any) -> int:
    v = _integer("max_tokens", value)
    if v < 1:
        raise ConfigError("max_tokens", f"must be an integer >= 1, got {value!r}")
    return v


def _check_stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise ConfigError("stop", f"expected a string or a list of strings, got {value!r}")
    if any(s == "" for s in value):
        raise ConfigError("stop", "stop strings must not be empty")
    return tuple(value)


FRESH_SEED_BITS = 53


def fresh_seed() -> int:
    """A seed for a run that was not given one: below 2**53, so a seed read back from JSON (jq,
    ``JSON.parse``: doubles) is the same integer and repeats the run."""
    return secrets.randbits(FRESH_SEED_BITS)


def _check_seed(value: Any) -> int | None:
    if value is None:
        return None
    v = _integer("seed", value)
    if not 0 <= v < 2**63:
        raise ConfigError("seed", f"must be an integer in [0, 2^63), got {value!r}")
    return v


def _check_typical_p(value: Any) -> float:
    v = _number("typical_p", value)
    if not 0 < v <= 1:
        raise ConfigError("typical_p", f"must be in (0, 1] (1 turns it off), got {value!r}")
    return v


def _check_non_negative(key: str, off: str) -> Any:
    def check(value: Any) -> float:
        v = _number(key, value)
        if v < 0:
            raise ConfigError(key, f"must be >= 0 ({off}), got {value!r}")
        return v

    return check


def _check_count(key: str, minimum: int, meaning: str) -> Any:
    def check(value: Any) -> int:
        v = _integer(key, value)
        if v < minimum:
            raise ConfigError(key, f"must be an integer >= {minimum} ({meaning}), got {value!r}")
        return v

    return check


def _check_unit(key: str, low: float, high: float, meaning: str) -> Any:
    def check(value: Any) -> float:
        v = _number(key, value)
        if not low <= v <= high:
            raise ConfigError(key, f"must be in [{low:g}, {high:g}] ({meaning}), got {value!r}")
        return v

    return check


def _check_xtc_threshold(value: Any) -> float:
    v = _number("xtc_threshold", value)
    if not 0 < v <= 0.5:
        raise ConfigError(
            "xtc_threshold",
            f"must be in (0, 0.5] (0 would leave only the least likely token; above 0.5 no two tokens pass), got {value!r}",
        )
    return v


def _check_dry_base(value: Any) -> float:
    v = _number("dry_base", value)
    if v < 1:
        raise ConfigError("dry_base", f"must be >= 1 (the penalty grows by this factor per token), got {value!r}")
    return v


def _check_strings(key: str) -> Any:
    def check(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
            raise ConfigError(key, f"expected a string or a list of strings, got {value!r}")
        if any(s == "" for s in value):
            raise ConfigError(key, "the strings must not be empty")
        return tuple(value)

    return check


LOGIT_BIAS_LIMIT = 100.0
"""As OpenAI's ``logit_bias``: -100 all but bans a token, +100 all but forces it."""


def _check_logit_bias(value: Any) -> tuple[tuple[str, float], ...]:
    """``{TOKEN: BIAS}`` (TOML table) or ``(TOKEN, BIAS)`` pairs; TOKEN is a token id written in
    digits or a text that must encode to one token (checked against the tokenizer when a run starts)."""
    pairs = value.items() if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple)) and not isinstance(value, dict):
        raise ConfigError("logit_bias", f"expected a table of TOKEN = BIAS, got {value!r}")
    out = []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not isinstance(pair[0], str) or not pair[0]:
            raise ConfigError("logit_bias", f"expected TOKEN = BIAS with a non-empty TOKEN, got {pair!r}")
        if isinstance(pair[1], bool) or not isinstance(pair[1], (int, float)) or not math.isfinite(pair[1]):
            raise ConfigError("logit_bias", f"the bias of {pair[0]!r} must be a finite number, got {pair[1]!r}")
        bias = float(pair[1])
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise ConfigError("logit_bias", f"the bias of {pair[0]!r} must be in [-100, 100], got {pair[1]!r}")
        out.append((pair[0], bias))
    return tuple(out)


def _check_flag(key: str) -> Any:
    def check(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value

    return check


def _check_open_unit(key: str, off: str) -> Any:
    """A probability below 1, 0 turning the stage off (epsilon, eta: 1 would remove everything)."""

    def check(value: Any) -> float:
        v = _number(key, value)
        if not 0 <= v < 1:
            raise ConfigError(key, f"must be in [0, 1) ({off}), got {value!r}")
        return v

    return check


SAMPLER_ORDER = (
    "temperature", "smoothing", "top_n_sigma", "top_k", "top_p", "typical_p", "epsilon", "eta", "top_h", "top_a",
    "p_less", "min_p", "xtc",
)  # fmt: skip
"""The stages ``samplers`` may order, in the default order: everything after the history stages
(biases, bans, penalties, DRY, the constraint run first, whatever the order). XTC samples a
mixture, so it stays last."""

SAMPLER_NAMES = {name: name for name in SAMPLER_ORDER} | {
    "temp": "temperature", "dynamic_temperature": "temperature", "quadratic_sampling": "smoothing",
    "typ_p": "typical_p", "typical": "typical_p", "epsilon_cutoff": "epsilon", "eta_cutoff": "eta",
}  # fmt: skip
"""Our stage names and llama-server's and text-generation-webui's (``samplers``, ``sampler_priority``)."""

HISTORY_SAMPLERS = frozenset(
    {"penalties", "dry", "repetition_penalty", "presence_penalty", "frequency_penalty", "no_repeat_ngram", "logit_bias"}
)
"""Peers' names for stages that read the history: accepted in a list (they always run first)."""


def _check_samplers(value: Any) -> tuple[str, ...]:
    """A list of stage names (or one string split at ``,`` or ``;``, as llama-server's ``--samplers``)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.replace(";", ",").split(",") if name.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(name, str) for name in value):
        raise ConfigError("samplers", f"expected a list of stage names, got {value!r}")
    names = []
    for name in value:
        if name in HISTORY_SAMPLERS:
            continue
        if name not in SAMPLER_NAMES:
            raise ConfigError("samplers", f"unknown stage {name!r}; the stages: {', '.join(SAMPLER_ORDER)}")
        if SAMPLER_NAMES[name] in names:
            raise ConfigError("samplers", f"{name!r} is listed twice")
        names.append(SAMPLER_NAMES[name])
    if "xtc" in names[:-1]:
        raise ConfigError("samplers", "xtc samples a mixture of two branches: it must come last")
    return tuple(names)


def _check_mirostat(value: Any) -> int:
    v = _integer("mirostat", value)
    if v not in (0, 1, 2):
        raise ConfigError("mirostat", f"must be 0 (off), 1 or 2 (the version), got {value!r}")
    return v


def _check_adaptive_target(value: Any) -> float:
    v = _number("adaptive_target", value)
    if v > 1:
        raise ConfigError("adaptive_target", f"must be in [0, 1], or negative to turn it off, got {value!r}")
    return v


def _check_description(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError("description", f"expected a string, got {value!r}")
    return value


_CHECKS = {
    "description": _check_description,
    "temperature": _check_temperature,
    "top_k": _check_top_k,
    "top_p": _check_top_p,
    "min_p": _check_min_p,
    "frequency_penalty": _check_penalty("frequency_penalty"),
    "presence_penalty": _check_penalty("presence_penalty"),
    "repetition_penalty": _check_repetition_penalty,
    "max_tokens": _check_max_tokens,
    "stop": _check_stop,
    "seed": _check_seed,
    "typical_p": _check_typical_p,
    "top_n_sigma": _check_non_negative("top_n_sigma", "0 turns it off"),
    "xtc_threshold": _check_xtc_threshold,
    "xtc_probability": _check_unit("xtc_probability", 0.0, 1.0, "0 turns it off"),
    "dry_multiplier": _check_non_negative("dry_multiplier", "0 turns it off"),
    "dry_base": _check_dry_base,
    "dry_allowed_length": _check_count("dry_allowed_length", 1, "repeats this long go unpenalised"),
    "dry_penalty_last_n": _check_count("dry_penalty_last_n", 0, "0 looks at the whole sequence"),
    "dry_sequence_breakers": _check_strings("dry_sequence_breakers"),
    "logit_bias": _check_logit_bias,
    "ban": _check_strings("ban"),
    "min_tokens": _check_count("min_tokens", 0, "0 turns it off"),
    "no_repeat_ngram_size": _check_count("no_repeat_ngram_size", 0, "0 turns it off"),
    "dynatemp_range": _check_non_negative("dynatemp_range", "0 turns it off"),
    "dynatemp_exponent": _check_non_negative("dynatemp_exponent", "1 maps the entropy linearly"),
    "smoothing_factor": _check_non_negative("smoothing_factor", "0 turns it off"),
    "smoothing_curve": _check_unit("smoothing_curve", 1.0, 10.0, "1 is the plain quadratic"),
    "epsilon_cutoff": _check_open_unit("epsilon_cutoff", "0 turns it off"),
    "eta_cutoff": _check_open_unit("eta_cutoff", "0 turns it off"),
    "top_h": _check_unit("top_h", 0.0, 1.0, "0 turns it off"),
    "top_a": _check_non_negative("top_a", "0 turns it off"),
    "p_less": _check_flag("p_less"),
    "samplers": _check_samplers,
    "reasoning_budget": _check_count("reasoning_budget", 0, "0 turns it off"),
    "mirostat": _check_mirostat,
    "mirostat_tau": _check_non_negative("mirostat_tau", "the target surprise in bits"),
    "mirostat_eta": _check_unit("mirostat_eta", 0.0, 1.0, "the learning rate of mu"),
    "adaptive_target": _check_adaptive_target,
    "adaptive_decay": _check_unit("adaptive_decay", 0.0, 0.99, "the weight of the running average's past"),
}

DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")
"""The default breakers of text-generation-webui and llama.cpp."""


@dataclass(frozen=True)
class SamplingConfig:
    """Every knob of the sampler; invalid values cannot be constructed."""

    description: str = ""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default=())
    seed: int | None = None
    typical_p: float = 1.0
    top_n_sigma: float = 0.0
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 0
    dry_sequence_breakers: tuple[str, ...] = field(default=DRY_SEQUENCE_BREAKERS)
    logit_bias: tuple[tuple[str, float], ...] = field(default=())
    ban: tuple[str, ...] = field(default=())
    min_tokens: int = 0
    no_repeat_ngram_size: int = 0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    smoothing_factor: float = 0.0
    smoothing_curve: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    top_h: float = 0.0
    top_a: float = 0.0
    p_less: bool = False
    samplers: tuple[str, ...] = field(default=())  # the order of SAMPLER_ORDER's stages; () the default
    reasoning_budget: int = 0  # thinking tokens before the block is closed by force (llmsample.sampling.budget)
    # The stages that carry per-row state from draw to draw (llmsample.sampling.carried), llama.cpp's names.
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    adaptive_target: float = -1.0  # adaptive-p; negative: off
    adaptive_decay: float = 0.9
    # A compiled :class:`llmsample.sampling.constraint.Constraint` (--json-schema, --regex, ...):
    # set by the commands, never by a preset, so it is not one of ``keys()``.
    constraint: Any = None

    def __post_init__(self) -> None:
        for key, check in _CHECKS.items():
            object.__setattr__(self, key, check(getattr(self, key)))
        self._check_unlisted()
        self._check_carried()

    def _check_carried(self) -> None:
        """Mirostat samples from its own truncation (it replaces the stages after the temperature,
        as in llama.cpp) and adaptive-p reshapes what they leave: the combinations that would have
        two stages sample are refused."""
        if self.mirostat and self.has_adaptive_p:
            raise ConfigError("adaptive_target", "adaptive-p and mirostat both choose the token; turn one off")
        if self.mirostat and self.samplers:
            raise ConfigError("samplers", "mirostat replaces the stages after the temperature; drop the list")
        if self.has_adaptive_p and self.has_xtc:
            raise ConfigError("adaptive_target", "adaptive-p and XTC both choose among the top tokens; turn one off")

    def _check_unlisted(self) -> None:
        """With ``samplers``, only the listed stages run: one that is set but not listed would be
        dropped silently, so it is refused."""
        if not self.samplers or self.is_greedy:
            return
        active = {
            "temperature": self.temperature != 1.0 or self.has_dynatemp, "smoothing": self.smoothing_factor > 0,
            "top_n_sigma": self.top_n_sigma > 0, "top_k": self.top_k > 0, "top_p": self.top_p < 1,
            "typical_p": self.typical_p < 1, "epsilon": self.epsilon_cutoff > 0, "eta": self.eta_cutoff > 0,
            "top_h": self.top_h > 0, "top_a": self.top_a > 0, "p_less": self.p_less, "min_p": self.min_p > 0,
            "xtc": self.has_xtc,
        }  # fmt: skip
        unlisted = [name for name in SAMPLER_ORDER if active[name] and name not in self.samplers]
        if unlisted:
            raise ConfigError(
                "samplers", f"{unlisted[0]} is set but not listed; list it or turn it off (only the listed stages run)"
            )

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The settings a preset, a request or a flag sets by name."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "constraint")

    @classmethod
    def from_mapping(cls, values: dict[str, Any], base: SamplingConfig | None = None) -> SamplingConfig:
        """Build from TOML-like data, rejecting unknown keys (a typo must not pass silently)."""
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ConfigError(unknown[0], f"unknown key; allowed keys: {', '.join(cls.keys())}")
        return dataclasses.replace(base or cls(), **values)

    def with_overrides(self, **overrides: Any) -> SamplingConfig:
        """Flags on top of a preset: None means 'not given'."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)

    @property
    def has_dry(self) -> bool:
        return self.dry_multiplier > 0

    @property
    def has_xtc(self) -> bool:
        return self.xtc_probability > 0

    @property
    def has_adaptive_p(self) -> bool:
        return self.adaptive_target >= 0

    @property
    def carries_state(self) -> bool:
        """Whether a stage of the chain keeps per-row state from the row's draws (mirostat's mu,
        adaptive-p's running average); a greedy chain has neither."""
        return not self.is_greedy and (self.mirostat > 0 or self.has_adaptive_p)

    @property
    def has_dynatemp(self) -> bool:
        return self.dynatemp_range > 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self.keys():
            value = getattr(self, key)
            if key == "logit_bias":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[key] = value
        return out
