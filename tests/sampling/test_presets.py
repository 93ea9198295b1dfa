"""Presets: built-ins, user presets, files, and every kind of bad TOML."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsample.errors import UserError
from llmsample.sampling import presets
from llmsample.sampling.config import ConfigError, SamplingConfig


def test_builtins_exist_and_balanced_is_the_default() -> None:
    found = presets.discover()
    assert {"balanced", "creative", "code", "deterministic"} <= set(found)
    name, cfg = presets.load()
    assert name == "balanced" and (cfg.temperature, cfg.top_k, cfg.top_p) == (0.7, 50, 0.9)
    assert presets.load("deterministic")[1].is_greedy


def test_user_preset_shadows_builtin(tmp_path: Path) -> None:
    user = tmp_path / "config" / "llmsample" / "presets"
    user.mkdir(parents=True)
    (user / "creative.toml").write_text("temperature = 1.3\n")
    (user / "mine.toml").write_text('description = "mine"\ntop_k = 3\nstop = ["\\n\\n"]\n')
    found = presets.discover()
    assert found["creative"].source == "user" and found["mine"].source == "user"
    assert presets.load("creative")[1].temperature == 1.3
    assert presets.load("mine")[1].stop == ("\n\n",)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("temperature = ", "not valid TOML"),
        ("temprature = 0.5", "temprature: unknown key"),
        ('temperature = "hot"', "temperature: expected a number"),
        ("temperature = -1", "temperature: must be >= 0"),
        ("temperature = nan", "temperature: must be finite"),
        ("temperature = inf", "temperature: must be finite"),
        ("top_p = 0", "top_p: must be in (0, 1]"),
        ("top_p = 1.5", "top_p: must be in (0, 1]"),
        ("top_k = -1", "top_k: must be an integer >= 0"),
        ("top_k = 2.5", "top_k: expected an integer"),
        ("min_p = 1.1", "min_p: must be in [0, 1]"),
        ("frequency_penalty = 3", "frequency_penalty: must be in [-2, 2]"),
        ("presence_penalty = -2.5", "presence_penalty: must be in [-2, 2]"),
        ("repetition_penalty = 0", "repetition_penalty: must be > 0"),
        ("max_tokens = 0", "max_tokens: must be an integer >= 1"),
        ('stop = [""]', "stop: stop strings must not be empty"),
        ("stop = [1]", "stop: expected a string"),
        ("seed = true", "seed: expected an integer"),
    ],
)
def test_bad_preset_files_name_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(UserError) as info:
        presets.read_preset_file(path)
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(UserError, match=r"unknown preset 'nope'.*balanced"):
        presets.load("nope")


def test_flags_override_preset() -> None:
    _, cfg = presets.load("code")
    assert cfg.with_overrides(temperature=0.9, top_k=None).temperature == 0.9
    assert cfg.with_overrides(top_k=None) is cfg
    with pytest.raises(ConfigError):
        cfg.with_overrides(top_p=0.0)


values = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 5),
        "top_k": st.integers(0, 1000),
        "top_p": st.floats(0.001, 1),
        "min_p": st.floats(0, 1),
        "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.1, 3),
        "max_tokens": st.integers(1, 4096),
        "seed": st.integers(0, 2**62),
        "stop": st.lists(st.text(min_size=1, max_size=5).filter(lambda s: "\x00" not in s), max_size=3),
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values)
def test_valid_toml_round_trips(tmp_path: Path, data: dict) -> None:
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))  # a real TOML writer: control characters in stop strings escaped
    cfg = presets.read_preset_file(path)
    expected = SamplingConfig.from_mapping({k: tuple(v) if k == "stop" else v for k, v in data.items()})
    assert cfg == expected
