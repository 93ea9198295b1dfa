"""What a sweep decodes: its settings (a grid of ``--vary`` values, presets, a TOML file of named
settings) times the prompts times the seeds, as ``batch`` request lines. The lines are whole
(preset, every key, seed), so ``batch`` run on them writes the same records (``sweep --plan``)."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmsample.batch.requests import SAMPLING_KEYS, Request, RequestError, read_requests
from llmsample.errors import UserError
from llmsample.sampling import presets as preset_store
from llmsample.sampling.config import ConfigError, SamplingConfig

PROMPT_KEYS = ("prompt", "messages", "system", "raw")
"""What a sweep keeps of a prompt file's line: the settings are the sweep's."""


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: a preset and the keys set on top of it (the run's flags under
    them), named for what it sets (``min_p=0.05 temperature=0.9``, or its TOML table's name)."""

    name: str
    preset: str
    values: dict[str, Any] = field(default_factory=dict)

    def config(self, base: dict[str, Any]) -> SamplingConfig:
        """Its sampling settings, checked: a bad value is one line naming the setting."""
        try:
            return preset_store.load(self.preset)[1].with_overrides(**base).with_overrides(**self.values)
        except ConfigError as exc:
            raise UserError(f"setting {self.name!r}: {exc.key}: {exc.reason}") from None


@dataclass(frozen=True)
class Planned:
    """One line of the sweep: which setting, prompt and seed it is."""

    setting: Setting
    prompt: int
    seed: int
    line: dict[str, Any]


def parse_vary(given: str) -> tuple[str, list[Any]]:
    """``temperature=0.6,0.9`` as the key and its values (numbers, true/false, else text)."""
    key, sep, values = given.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not values.strip():
        raise UserError(f"--vary {given!r}: expected KEY=V1,V2,... such as temperature=0.6,0.9")
    _check_key(key, f"--vary {given!r}")
    return key, [_value(text.strip()) for text in values.split(",")]


def settings_of(
    presets: Sequence[str], varies: Sequence[str], toml_path: Path | None, base_preset: str
) -> list[Setting]:
    """Every preset (else the run's) times the grid of ``varies``, then the TOML file's tables;
    nothing to sweep, or two settings of one name, is one line."""
    grid = [parse_vary(given) for given in varies]
    keys = [key for key, _ in grid]
    if len(set(keys)) < len(keys):
        raise UserError(f"--vary names {next(k for k in keys if keys.count(k) > 1)} twice; give its values once")
    settings = []
    if presets or grid:
        for preset in presets or [base_preset]:
            for values in itertools.product(*(values for _, values in grid)):
                chosen = dict(zip(keys, values, strict=True))
                words = ([preset] if presets else []) + [f"{key}={_shown(value)}" for key, value in chosen.items()]
                settings.append(Setting(" ".join(words), preset, chosen))
    if toml_path is not None:
        settings += _toml_settings(toml_path, base_preset)
    if not settings:
        raise UserError("nothing to sweep: give --vary KEY=V1,V2, --presets A,B or --settings FILE.toml")
    names = [s.name for s in settings]
    if len(set(names)) < len(names):
        raise UserError(f"two settings are named {next(n for n in names if names.count(n) > 1)!r}; name each once")
    return settings


def read_prompts(lines: Sequence[bytes], source: str) -> list[dict[str, Any]]:
    """The prompt file's prompts (plain text, or JSON lines with a prompt or messages, a system
    message, raw), as request keys; a bad line, or one with settings of its own, is one line."""
    prompts = []
    for request in read_requests(lines):
        if isinstance(request, RequestError):
            raise UserError(f"{source}: {request.message}")
        if request.openai or request.preset or request.overrides:
            raise UserError(f"{source} line {request.line}: a sweep's prompts carry no settings (the sweep sets them)")
        prompts.append(_prompt_keys(request))
    if not prompts:
        raise UserError(f"{source} holds no prompt: write one per line")
    return prompts


def plan(settings: Sequence[Setting], prompts: Sequence[dict[str, Any]], seeds: Sequence[int],
         base: dict[str, Any]) -> list[Planned]:  # fmt: skip
    """Every setting × prompt × seed as a whole ``batch`` line, settings outermost; the same
    seeds under every setting (their differences are the settings', not the draws'). A line's
    id ends in a digest of what it asks, so a resumed ``-o`` file's record counts only for the
    very same line (not after ``-n``, a prompt or a setting's keys changed)."""
    for setting in settings:
        setting.config(base)  # checked before anything runs
    planned = []
    for setting, (p, prompt), seed in itertools.product(settings, enumerate(prompts), seeds):
        line = {**prompt, "preset": setting.preset, **base, **setting.values, "seed": seed}
        custom_id = f"{setting.name} | prompt {p} | seed {seed} | {_digest(line)}"
        planned.append(Planned(setting, p, seed, {"custom_id": custom_id, **line}))
    return planned


def _digest(line: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(line, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:8]


def _toml_settings(path: Path, base_preset: str) -> list[Setting]:
    try:
        tables = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not TOML ({exc})") from None
    settings = []
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise UserError(f"{path}: {name} is not a table; write [{name}] and its keys under it")
        values = {key.replace("-", "_"): value for key, value in table.items() if key != "preset"}
        for key in values:
            _check_key(key, f"{path} [{name}]")
        settings.append(Setting(name, str(table.get("preset", base_preset)), values))
    return settings


def _check_key(key: str, where: str) -> None:
    if key in ("seed", "preset"):
        raise UserError(f"{where}: a sweep sets {key} itself (--seeds, --presets)")
    if key not in SAMPLING_KEYS:
        near = difflib.get_close_matches(key, SAMPLING_KEYS, n=1)
        hint = f"; did you mean {near[0]}?" if near else "; see llmsample presets show balanced"
        raise UserError(f"{where}: no sampling key {key!r}{hint}")


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _prompt_keys(request: Request) -> dict[str, Any]:
    keys: dict[str, Any] = {"messages": request.messages} if request.messages is not None else {"prompt": request.prompt}
    if request.system is not None:
        keys["system"] = request.system
    if request.raw:
        keys["raw"] = True
    return keys
