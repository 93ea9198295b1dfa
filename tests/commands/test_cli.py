"""The CLI end to end on a tiny model: output formats, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from tests.conftest import cli_env


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_help_lists_the_commands() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("generate", "presets", "models"):
        assert command in result.output


def test_jsonl_tokens_concatenate_to_summary(tiny_model_dir: Path) -> None:
    result = invoke(
        "generate",
        "-m",
        str(tiny_model_dir),
        "--raw",
        "-p",
        "w4 w5",
        "-n",
        "12",
        "--seed",
        "3",
        "--format",
        "jsonl",
        "--ignore-eos",
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    tokens, summary = lines[:-1], lines[-1]
    assert summary["type"] == "summary" and summary["tokens"] == 12 == len(tokens)
    assert "".join(t["text"] for t in tokens) == summary["text"]
    assert summary["seed"] == 3 and summary["preset"] == "balanced" and summary["stop_reason"] == "length"
    for key in ("index", "token_id", "text", "prob", "model_prob", "model_rank", "entropy", "top"):
        assert key in tokens[0]
    assert set(tokens[0]["top"][0]) == {"token_id", "text", "prob", "model_prob"}


def test_prompt_from_stdin_and_seed_reproduces(tiny_model_dir: Path) -> None:
    args = ("generate", "-m", str(tiny_model_dir), "--raw", "-n", "10", "--seed", "5", "--ignore-eos", "-q")
    first = invoke(*args, input="w7 w8 w9")
    second = invoke(*args, "--prompt", "-", input="w7 w8 w9")
    assert first.exit_code == 0 and first.stdout == second.stdout and first.stdout.strip()


def test_a_drawn_seed_survives_a_json_reader_and_repeats_the_run(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """jq and ``JSON.parse`` read numbers as doubles: a drawn seed must be below 2**53 to come back
    as itself. Each draw is pinned to its top bit so a wider seed shows at once."""
    import secrets

    from llmsample.sampling import config

    drawn = []
    monkeypatch.setattr(secrets, "randbits", lambda bits: drawn.append(bits) or (1 << bits) - 1)
    args = ("generate", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "4", "--ignore-eos", "--format", "jsonl")
    first = invoke(*args)
    seed = json.loads(first.stdout.splitlines()[-1])["seed"]
    assert drawn == [config.FRESH_SEED_BITS] and seed == 2**53 - 1 and int(float(seed)) == seed
    again = invoke(*args, "--seed", str(int(float(seed))))
    assert again.stdout.splitlines()[:-1] == first.stdout.splitlines()[:-1]  # the summary has timings


def test_piped_text_has_no_escape_codes(tiny_model_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmsample",
            "generate",
            "-m",
            str(tiny_model_dir),
            "--raw",
            "-p",
            "w3",
            "-n",
            "8",
            "--ignore-eos",
        ],
        capture_output=True,
        text=True,
        env=cli_env(FORCE_COLOR="1"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and result.stdout.strip()


def test_presets_list_and_show() -> None:
    listing = invoke("presets", "list")
    assert listing.exit_code == 0 and "deterministic" in listing.stdout and "built-in" in listing.stdout
    shown = invoke("presets", "show", "balanced")
    assert "temperature = 0.7" in shown.stdout and "top_k = 50" in shown.stdout


def test_models_lists_the_default() -> None:
    result = invoke("models")
    assert result.exit_code == 0 and "SmolLM2-135M-Instruct" in result.stdout


@pytest.mark.parametrize(
    ("seed", "samples", "fragment"),
    [
        (-1, 1, "--seed: must be an integer in [0, 2^63), got -1"),
        (2**63 - 2, 3, f"--seed: sample 2 uses seed S+2, which must be an integer in [0, 2^63), got {2**63}"),
    ],
)
def test_compare_seeds_are_checked_against_the_config_before_loading(seed: int, samples: int, fragment: str) -> None:
    result = invoke("compare-presets", "-m", "/nonexistent", "-p", "x", "--seed", str(seed), "--samples", str(samples))
    assert result.exit_code == 2 and fragment in result.stderr and "/nonexistent" not in result.stderr


def test_compare_accepts_every_seed_the_config_does(tiny_model_dir: Path) -> None:
    args = ("compare-presets", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "2", "-q", "--format", "jsonl")
    result = invoke(*args, "--presets", "balanced", "--samples", "2", "--seed", str(2**63 - 2))
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["seed"] for line in result.stdout.splitlines()] == [2**63 - 2, 2**63 - 1]



def test_compare_table_has_a_key_for_every_metric(tiny_model_dir: Path) -> None:
    from llmsample.commands.compare_presets import METRIC_KEY

    args = ("compare-presets", "-m", str(tiny_model_dir), "--raw", "-p", "w3", "-n", "3", "-q", "--samples", "2")
    result = invoke(*args, "--presets", "balanced,deterministic")
    assert result.exit_code == 0, result.output
    for header, meaning in METRIC_KEY.items():
        assert meaning[:30] in " ".join(result.stdout.split()), header

FROZEN_AT_EXIT = """
import atexit, gc, sys
from llmsample.cli import main
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, file=sys.stderr))
sys.argv = ["llmsample", *sys.argv[1:]]
main()
"""


def test_a_process_of_its_own_leaves_its_objects_to_the_exit() -> None:
    """The interpreter's last collections are skipped in a process of its own; an embedded call
    (arguments given) keeps its objects collectable."""
    done = subprocess.run([sys.executable, "-c", FROZEN_AT_EXIT, "presets", "list"], capture_output=True, text=True)
    assert done.returncode == 0 and "creative" in done.stdout
    assert done.stderr.strip() == "frozen True"
    import gc

    before = gc.get_freeze_count()
    assert CliRunner().invoke(main, ["presets", "list"]).exit_code == 0
    assert gc.get_freeze_count() == before
