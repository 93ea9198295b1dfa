"""Decoding settings: one validated, frozen object shared by presets, flags and the loop."""

from __future__ import annotations

import dataclasses
import math
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


def _check_seed(value: Any) -> int | None:
    if value is None:
        return None
    v = _integer("seed", value)
    if not 0 <= v < 2**63:
        raise ConfigError("seed", f"must be an integer in [0, 2^63), got {value!r}")
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
}


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

    def __post_init__(self) -> None:
        for key, check in _CHECKS.items():
            object.__setattr__(self, key, check(getattr(self, key)))

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

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

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}
