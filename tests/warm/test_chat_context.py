"""A warm chat past the model's context drops its oldest exchanges as the in-process chat does:
the engine fits the conversation with the same function and the same room for the reply, and
the chat here forgets the same exchanges, so the transcript and the notes are the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_tiny_model, with_chat_template
from tests.warm.conftest import TEMPLATE, Engine, start_engine

SESSION = "".join(f"w{3 + i} w{4 + i} w{5 + i} w{6 + i}\n" for i in range(7))


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """An engine of a chat model whose context is 40 positions: a few exchanges fill it."""
    model = with_chat_template(make_tiny_model(tmp_path_factory.mktemp("short"), positions=40), TEMPLATE)
    engine = start_engine(model)
    yield engine
    engine.cli("stop", "--all")


def dropped(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if "oldest exchange" in line]


def test_a_chat_past_the_context_drops_its_oldest_exchanges_alike(short: Engine, tmp_path: Path) -> None:
    args = ("chat", *short.load_args, "--seed", "2", "-n", "8", "--no-log")
    save = "/save {}\n"
    warm = short.cli(*args, input=SESSION + save.format(tmp_path / "warm.jsonl"))
    local = short.cli(*args, "--local", input=SESSION + save.format(tmp_path / "local.jsonl"))
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert warm.stdout == local.stdout and warm.stdout.count("\n") >= 7
    assert dropped(warm.stderr) == dropped(local.stderr) and len(dropped(warm.stderr)) >= 2
    assert warm.stderr.count("engine unix:") == 7  # every reply on the engine
    kept = (tmp_path / "warm.jsonl").read_text().splitlines()[1:]  # the turns left, without the header
    assert kept == (tmp_path / "local.jsonl").read_text().splitlines()[1:] and len(kept) < 14
