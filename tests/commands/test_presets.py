"""``llmsample presets show``: what a preset sets apart from the defaults, as TOML that reads back."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from llmsample.sampling.presets import load
from tests.conftest import cli_env


def keys(toml: str) -> list[str]:
    return re.findall(r"^(\w+) =", toml, re.MULTILINE)


def test_show_puts_what_a_preset_sets_before_the_defaults() -> None:
    done = subprocess.run([sys.executable, "-m", "llmsample", "presets", "show", "creative"], capture_output=True,
                          text=True, env=cli_env(), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    own, defaults = done.stdout.split("\n\n")
    assert own.startswith("#") and defaults.startswith("#")
    assert keys(own) == ["description", "top_p", "min_p", "frequency_penalty", "presence_penalty"]
    assert {"temperature", "top_k", "mirostat"} <= set(keys(defaults))  # creative's temperature 1.0 is the default
    assert tomllib.loads(done.stdout) == {k: v for k, v in load("creative")[1].as_dict().items() if v is not None}
