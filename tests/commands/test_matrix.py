"""Where features meet: every command x every built-in preset x every drafter x every output,
in process on tiny models (each loaded once), plus a few real subprocesses.

Each run must exit 0 and leave well-formed output; JSON lines must be strict (no NaN) and their
token texts must add up to the summary's text; greedy speculation must equal the plain loop."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.models import loading as models
from tests.conftest import cli_env, make_tiny_model

PRESETS = ("balanced", "creative", "code", "deterministic", "fiction")
OUTPUTS = ("text", "jsonl", "inspect", "html")
# Repeats, so that the n-gram drafter both hits and misses (a miss drafts nothing).
PROMPT = "w4 w5 w6 w7 w4 w5 w6 w7 w4 w5"
BASE = ("--raw", "-p", PROMPT, "-n", "10", "--seed", "11", "--device", "cpu", "--ignore-eos", "-q")


def strict_json(line: str) -> dict[str, Any]:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} in {line[:80]!r}")

    return json.loads(line, parse_constant=refuse)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A different random model with the same tokenizer: drafts that are often rejected."""
    return make_tiny_model(tmp_path_factory.mktemp("draft"), seed=7)


@pytest.fixture(autouse=True)
def load_each_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "load_model", _cached_load)


@functools.cache
def _cached_load(*args: Any, **kwargs: Any) -> models.LoadedModel:
    return _real_load(*args, **kwargs)


_real_load = models.load_model


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output
    return result


def output_args(output: str, tmp_path: Path) -> tuple[str, ...]:
    return {
        "text": ("--format", "text"),
        "jsonl": ("--format", "jsonl"),
        "inspect": ("--inspect",),
        "html": ("--html", str(tmp_path / "view.html")),
    }[output]


def check_jsonl(stdout: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    lines = [strict_json(line) for line in stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert summary["type"] == "summary" and all(t["type"] == "token" for t in tokens)
    assert summary["tokens"] == len(tokens) == 10
    assert "".join(t["text"] for t in tokens) == summary["text"]
    for token in tokens:
        assert 0 < token["prob"] <= 1 and 0 < token["model_prob"] <= 1
    return tokens, summary


def check_output(output: str, stdout: str, tmp_path: Path) -> None:
    if output == "jsonl":
        check_jsonl(stdout)
    elif output == "html":
        page = (tmp_path / "view.html").read_text()
        assert page.lower().startswith("<!doctype html>") and page.rstrip().endswith("</html>")
        assert stdout.strip()
    else:
        assert stdout.strip() and "\x1b[" not in stdout  # piped: plain
        if output == "inspect":
            assert "p model" in stdout and "removed" in stdout


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("preset", PRESETS)
def test_generate_and_speculate(
    preset: str, output: str, tiny_model_dir: Path, draft_dir: Path, tmp_path: Path
) -> None:
    model = ("-m", str(tiny_model_dir), "--preset", preset, *BASE, *output_args(output, tmp_path))
    runs = {
        "plain": ("generate", *model),
        "ngram": ("generate", *model, "--draft", "ngram"),
        "model": ("generate", *model, "--draft", str(draft_dir)),
        "speculate-ngram": ("speculate", *model),
        "speculate-model": ("speculate", *model, "--draft", str(draft_dir), "--compare"),
    }
    stdouts = {}
    for name, args in runs.items():
        stdouts[name] = invoke(*args).stdout
        check_output(output, stdouts[name], tmp_path)
    if preset == "deterministic":  # greedy: speculation changes the speed, never the tokens
        if output == "jsonl":
            outcomes = {name: tuple(t["token_id"] for t in check_jsonl(out)[0]) for name, out in stdouts.items()}
        else:
            outcomes = {name: out.splitlines()[0] for name, out in stdouts.items()}
        assert len(set(outcomes.values())) == 1, outcomes


@pytest.mark.parametrize("output", ("text", "jsonl", "html"))
def test_compare_presets_every_builtin(output: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    extra = {"text": (), "jsonl": ("--format", "jsonl"), "html": ("--html", str(tmp_path / "view.html"))}[output]
    result = invoke(
        "compare-presets", "-m", str(tiny_model_dir), "--raw", "-p", PROMPT, "-n", "8", "--samples", "2",
        "--device", "cpu", "-q", "--presets", ",".join(PRESETS), *extra,
    )  # fmt: skip
    if output == "jsonl":
        records = [strict_json(line) for line in result.stdout.splitlines()]
        assert sorted((r["preset"], r["sample"]) for r in records) == sorted((p, s) for p in PRESETS for s in (0, 1))
    else:
        assert all(name in result.stdout for name in PRESETS)
    if output == "html":
        assert (tmp_path / "view.html").read_text().rstrip().endswith("</html>")


@pytest.mark.parametrize("fmt", ("text", "jsonl"))
@pytest.mark.parametrize("preset", PRESETS)
def test_explain_every_builtin(preset: str, fmt: str, tiny_model_dir: Path) -> None:
    common = ("explain", "-m", str(tiny_model_dir), "--raw", "-p", PROMPT, "--device", "cpu", "-q")
    for extra in ((), ("--continuation", "w6 w7 w4")):
        result = invoke(*common, "--preset", preset, "--format", fmt, *extra)
        if fmt == "jsonl":
            records = [strict_json(line) for line in result.stdout.splitlines()]
            assert records and {r["type"] for r in records} <= {"chain", "scored"}
        else:
            assert result.stdout.strip()


@pytest.mark.parametrize(
    "args",
    [
        ("speculate", "--draft", "ngram", "--preset", "creative"),  # penalties + speculation
        ("generate", "--repetition-penalty", "1e-40", "--temperature", "1"),  # an overflowing penalty
        ("generate", "--temperature", "0.00011", "--presence-penalty", "-2", "--frequency-penalty", "-2"),
    ],
)
def test_real_subprocess_meeting_points(args: tuple[str, ...], tiny_model_dir: Path) -> None:
    command = [sys.executable, "-m", "llmsample", *args, "-m", str(tiny_model_dir), *BASE, "--format", "jsonl"]
    result = subprocess.run(command, capture_output=True, text=True, env=cli_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    check_jsonl(result.stdout)
