"""An engine started with a drafter (``llmsample start --draft MODEL``): a command run with the
same ``--draft`` speculates on it, its records the in-process run's; its status names the
capability; another ``--draft`` is refused in one line saying how to get it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmsample.client.connection import Target, get_json
from llmsample.client.wire import ENGINE_PATH
from tests.warm.conftest import Engine, start_engine
from tests.warm.test_contract import jsonl


@pytest.fixture(scope="module")
def drafting(chat_model: Path) -> Iterator[Engine]:
    """One row at a time (as ``--local`` runs one job), the model as its own draft (one tokenizer)."""
    engine = start_engine(chat_model, "--batch-size", "1", "--draft", str(chat_model))
    yield engine
    engine.cli("stop", "--all")


def test_the_engines_draft_model_speculates_as_in_process(drafting: Engine) -> None:
    args = ("speculate", *drafting.load_args, "-p", "w3 w4 w5 w3 w4", "--seed", "4", "-n", "20", "--draft",
            str(drafting.model), "--draft-tokens", "3", "--format", "jsonl")  # fmt: skip
    warm, local = drafting.cli(*args), drafting.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert jsonl(warm.stdout) == jsonl(local.stdout)
    summary = json.loads(warm.stdout.splitlines()[-1])
    assert summary["engine"].startswith("unix:") and summary["drafted"] > 0
    status = get_json(Target("unix:" + drafting.record()["socket"]), ENGINE_PATH)
    assert status["capabilities"] == ["drafter"] and drafting.record()["draft"] == str(drafting.model.resolve())


def test_another_draft_is_one_line_naming_how(drafting: Engine) -> None:
    done = drafting.generate("-p", "w3", "--draft", "suffix")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "--draft suffix does not run on the warm engine" in done.stderr and "start it with --draft suffix" in done.stderr
