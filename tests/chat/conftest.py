"""A tiny random model with a chat template (words of its vocabulary mark the roles), and a
driver for ``llmsample chat`` in a real pseudo-terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, cli_env, make_tiny_model, with_chat_template

# system w5 … w6, user w3 … w6, assistant w4 … w6; the reply starts after "w4".
TEMPLATE = (
    "{% for m in messages %}"
    "{{ {'system': 'w5', 'user': 'w3', 'assistant': 'w4'}[m['role']] }} {{ m['content'] }} w6 "
    "{% endfor %}{% if add_generation_prompt %}w4 {% endif %}"
)


def make_chat_model(path: Path, **kwargs) -> Path:
    return with_chat_template(make_tiny_model(path, **kwargs), TEMPLATE)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_model(tmp_path_factory.mktemp("chat"), vocab_size=48)


@pytest.fixture(scope="session")
def chat_lm(chat_model_dir: Path):
    from llmsample.models.loading import load_model

    return load_model(str(chat_model_dir), "cpu", "float32")


@pytest.fixture(scope="session")
def byte_chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level model with the chat template: its replies can hold any character."""
    from tests.constraints.conftest import make_byte_model

    return with_chat_template(make_byte_model(tmp_path_factory.mktemp("bytes")), TEMPLATE)


def chat_command(model: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "llmsample", "chat", "-m", str(model), "--device", "cpu", "--dtype", "float32", *args]


def spawn_chat(model: Path, tmp_path: Path, *args: str, **env: str):
    """``llmsample chat`` in a pty (colour on, history under ``tmp_path``)."""
    import pexpect

    command = chat_command(model, *args)
    environment = cli_env(
        XDG_STATE_HOME=str(tmp_path / "state"), TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1",
        PYTHONPATH=str(REPO), COLUMNS="200", **env,
    )  # fmt: skip
    child = pexpect.spawn(command[0], command[1:], env=environment, cwd=str(tmp_path), encoding="utf-8", timeout=60)
    child.setwinsize(40, 200)
    return child
