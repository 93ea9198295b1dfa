"""An engine started with models beside its own (``llmsample start --draft MODEL --reference``):
a command run with the same ``--draft`` speculates on it, one run with ``--reference`` is scored
on it, their records the in-process run's, and one without either is a plain row; its status and
``ps`` name the capabilities; another ``--draft`` is refused in one line saying how to get it."""

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
    engine = start_engine(chat_model, "--batch-size", "1", "--draft", str(chat_model), "--reference")
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
    assert status["capabilities"] == ["drafter", "reference"]
    assert drafting.record()["draft"] == str(drafting.model.resolve()) and drafting.record()["reference"]
    assert "batched+drafter+reference" in drafting.cli("ps").stdout


@pytest.mark.parametrize("reference", [True, False])
def test_the_engines_reference_scores_a_run_that_asks_as_in_process(drafting: Engine, reference: bool) -> None:
    args = ("-p", "w3 w4", "--seed", "2", "-n", "12", "--format", "jsonl", *(("--reference",) * reference))
    warm, local = drafting.generate(*args), drafting.generate(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert jsonl(warm.stdout) == jsonl(local.stdout)
    tokens = [json.loads(line) for line in warm.stdout.splitlines()[:-1]]
    assert all(("reference" in token) is reference for token in tokens)
    assert ("reference" in json.loads(warm.stdout.splitlines()[-1])) is reference


def test_a_batch_with_reference_runs_on_the_engine(drafting: Engine, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("w3 w4\nw5\n")
    args = ("batch", *drafting.load_args, str(tmp_path / "in.txt"), "--seed", "1", "-n", "6", "--reference")
    warm, local = drafting.cli(*args), drafting.cli(*args, "--local", "--batch-size", "1")  # as the engine's rows
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    assert "on the engine at unix:" in warm.stderr
    rows = [jsonl(done.stdout) for done in (warm, local)]
    assert rows[0] == rows[1] and all("reference" in json.dumps(row) for row in rows[0])


def test_another_draft_is_one_line_naming_how(drafting: Engine) -> None:
    done = drafting.generate("-p", "w3", "--draft", "suffix")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "--draft suffix does not run on the warm engine" in done.stderr and "start it with --draft suffix" in done.stderr


def test_starting_it_again_with_what_it_lacks_is_one_line(engine: Engine) -> None:
    """A plain engine runs: ``start --reference`` says to stop it first rather than reuse it."""
    done = engine.cli("start", *engine.load_args, "--reference")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "already runs without --reference: stop it first" in done.stderr
