"""A real warm engine (``llmsample start``) on a tiny chat model, in a runtime directory of the
module's own, stopped when the module's tests are done; and the CLI run beside it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cli_env, make_tiny_model, with_chat_template

TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


@dataclass
class Engine:
    model: Path
    env: dict[str, str]  # the CLI's environment: this engine's runtime directory
    runtime: Path

    def cli(self, *args: str, timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "llmsample", *args]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=timeout, **kwargs)

    def generate(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess:
        return self.cli("generate", *self.load_args, *args, **kwargs)

    @property
    def load_args(self) -> tuple[str, ...]:
        return ("-m", str(self.model), "--device", "cpu", "--dtype", "float32")

    def record(self) -> dict:
        (path,) = (self.runtime / "llmsample").glob("*.json")
        return json.loads(path.read_text())


def start_engine(model: Path, *args: str) -> Engine:
    runtime = Path(tempfile.mkdtemp(prefix="ls-"))
    engine = Engine(model, cli_env(XDG_RUNTIME_DIR=str(runtime)), runtime)
    done = engine.cli("start", *engine.load_args, "-q", *args)
    assert done.returncode == 0, done.stderr
    return engine


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_chat_template(make_tiny_model(tmp_path_factory.mktemp("warm")), TEMPLATE)


@pytest.fixture(scope="module")
def engine(chat_model: Path) -> Iterator[Engine]:
    engine = start_engine(chat_model, "--keep-alive", "10m")
    yield engine
    engine.cli("stop", "--all")
