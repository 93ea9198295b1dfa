"""What the page is told (no browser): a control for every numeric key of the chain, each
preset's values for all of them, and chat mode only for a model with a chat template."""

from __future__ import annotations

import dataclasses
import typing
from types import SimpleNamespace

import pytest

from llmsample.batch.run import BatchSettings
from llmsample.sampling.config import SamplingConfig
from llmsample.serve.page import CONTROLS, page_config

NOT_CONTROLS = {"seed"}  # the page's own field beside the preset: a number, but no slider


def numeric_keys() -> set[str]:
    hints = typing.get_type_hints(SamplingConfig)
    return {f.name for f in dataclasses.fields(SamplingConfig) if hints[f.name] in (int, float, bool)} - NOT_CONTROLS


def test_every_numeric_key_of_the_chain_has_one_control() -> None:
    keys = [control.key for control in CONTROLS]
    assert len(keys) == len(set(keys))
    assert set(keys) == numeric_keys()
    for control in CONTROLS:
        assert control.low < control.high and control.step > 0
        default = float(getattr(SamplingConfig(), control.key))
        assert control.low <= default <= control.high, control.key  # the defaults fit the sliders


@pytest.mark.parametrize("template, chat", [("{{ messages }}", True), (None, False)])
def test_chat_mode_only_for_a_model_with_a_chat_template(template: str | None, chat: bool) -> None:
    lm = SimpleNamespace(name="tiny", tokenizer=SimpleNamespace(chat_template=template), context_length=64)
    config = page_config(lm, BatchSettings(preset="creative"), frozenset({"creative", "deterministic"}))
    assert config["chat"] is chat and config["context_length"] == 64
    assert config["server_default"]["name"] == "creative"
    keys = {control.key for control in CONTROLS}
    for values in [config["server_default"], *config["presets"].values()]:
        assert keys <= set(values)
    assert config["presets"]["deterministic"]["temperature"] == 0
