"""The newer samplers' flags and preset keys: parsed, validated in one line, shown by
``presets show`` as TOML that reads back, and resolved against the tokenizer before any output."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.sampling.presets import read_preset_file

MODEL_ARGS = ("--raw", "-p", "w4 w5 w6", "-n", "6", "--seed", "1", "--device", "cpu", "-q", "--format", "jsonl")


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (("--typical-p", "0"), "--typical-p: must be in (0, 1]"),
        (("--top-n-sigma", "-1"), "--top-n-sigma: must be >= 0"),
        (("--xtc-threshold", "0.7"), "--xtc-threshold: must be in (0, 0.5]"),
        (("--xtc-probability", "2"), "--xtc-probability: must be in [0, 1]"),
        (("--dry-multiplier", "-1"), "--dry-multiplier: must be >= 0"),
        (("--dry-base", "0.5"), "--dry-base: must be >= 1"),
        (("--dry-allowed-length", "0"), "--dry-allowed-length: must be an integer >= 1"),
        (("--dry-penalty-last-n", "-2"), "--dry-penalty-last-n: must be an integer >= 0"),
        (("--dry-sequence-breaker", ""), "--dry-sequence-breaker: the strings must not be empty"),
        (("--ban", ""), "--ban: the strings must not be empty"),
        (("--min-tokens", "-1"), "--min-tokens: must be an integer >= 0"),
        (("--no-repeat-ngram-size", "-1"), "--no-repeat-ngram-size: must be an integer >= 0"),
        (("--dynatemp-range", "-0.5"), "--dynatemp-range: must be >= 0"),
        (("--dynatemp-exp", "-1"), "--dynatemp-exponent: must be >= 0"),
        (("--smoothing-factor", "-1"), "--smoothing-factor: must be >= 0"),
        (("--smoothing-curve", "0.5"), "--smoothing-curve: must be in [1, 10]"),
        (("--epsilon-cutoff", "1"), "--epsilon-cutoff: must be in [0, 1)"),
        (("--eta-cutoff", "-0.1"), "--eta-cutoff: must be in [0, 1)"),
        (("--top-h", "1.5"), "--top-h: must be in [0, 1]"),
        (("--top-a", "-1"), "--top-a: must be >= 0"),
        (("--logit-bias", "504"), "is not TOKEN=BIAS"),
        (("--logit-bias", "504=lots"), "is not TOKEN=BIAS"),
        (("--logit-bias", "504=200"), "--logit-bias: the bias of '504' must be in [-100, 100]"),
    ],
)
def test_bad_values_fail_in_one_line_before_the_model_loads(flags: tuple[str, ...], fragment: str) -> None:
    result = run("generate", "-m", "/nonexistent", *MODEL_ARGS, *flags)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""


def test_a_bias_text_that_is_not_one_token_fails_before_any_output(tiny_model_dir: Path) -> None:
    result = run("generate", "-m", str(tiny_model_dir), *MODEL_ARGS, "--logit-bias", "w5 w6=2")
    assert result.exit_code == 2, result.output
    assert "'w5 w6' encodes to 2 tokens" in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_flags_reach_the_chain(tiny_model_dir: Path) -> None:
    import json

    flags = ("--ban", "w7", "--logit-bias", "w9=100", "--logit-bias", "9=100", "--min-tokens", "6",
             "--dry-multiplier", "0.5", "--dry-sequence-breaker", "w4", "--typical-p", "0.99")  # fmt: skip
    result = run("generate", "-m", str(tiny_model_dir), *MODEL_ARGS, "--ignore-eos", *flags)
    assert result.exit_code == 0, result.output
    tokens = [json.loads(line) for line in result.stdout.splitlines()][:-1]
    assert tokens and all(t["token_id"] != 7 for t in tokens)
    assert all(t["removed"]["ban"] >= 1 and t["removed"]["min_tokens"] >= 1 for t in tokens)


def test_the_newer_stages_flags_reach_the_chain(tiny_model_dir: Path) -> None:
    import json

    flags = ("--no-repeat-ngram-size", "1", "--dynatemp-range", "0.5", "--smoothing-factor", "0.2",
             "--epsilon-cutoff", "0.001", "--eta-cutoff", "0.001", "--top-h", "0.9", "--top-a", "0.01", "--p-less")  # fmt: skip
    result = run("generate", "-m", str(tiny_model_dir), *MODEL_ARGS, "--ignore-eos", *flags)
    assert result.exit_code == 0, result.output
    tokens = [json.loads(line) for line in result.stdout.splitlines()][:-1]
    assert {"no_repeat_ngram", "epsilon", "eta", "top_h", "top_a", "p_less"} <= set(tokens[0]["removed"])
    ids = [t["token_id"] for t in tokens]
    assert len(set(ids)) == len(ids)  # n-gram size 1: no token twice
    assert all(t["removed"]["no_repeat_ngram"] >= 3 for t in tokens)  # the prompt's three tokens at least


EVERY_TEXT = ("--ban", "w", "--ban", "<")  # the tiny model's every token text holds one of them


@pytest.mark.parametrize(
    "command",
    [
        ("generate", "-n", "6"),
        ("generate", "-n", "6", "-t", "0"),
        ("speculate", "-n", "6", "--draft", "ngram"),
        ("explain",),
        ("explain", "--continuation", "w5 w6"),
    ],
)
def test_bans_that_leave_nothing_are_one_line_exit_1(tiny_model_dir: Path, command: tuple[str, ...]) -> None:
    """Issue 25, 14: bans that remove every candidate were lifted (text came out, removed.ban 0)."""
    result = run(*command, "-m", str(tiny_model_dir), "--raw", "-p", "w4 w5 w4 w5", "--seed", "1", *EVERY_TEXT)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: the bans leave no token to generate at token 0 (position 4)")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "w" not in result.stdout


def test_bans_with_min_tokens_that_leave_nothing_name_both(tiny_model_dir: Path) -> None:
    """The bans leave only <eos>, which min-tokens removes before the third token: one line
    naming both (min-tokens used to be lifted, and the run ended at once on <eos>)."""
    bans = ("--ban", "<b", "--ban", "<u", "--ban", "w")
    result = run("generate", "-m", str(tiny_model_dir), *MODEL_ARGS, *bans, "--min-tokens", "3")
    assert result.exit_code == 1, result.output
    assert "Error: the bans and min_tokens leave no token to generate at token 0" in result.stderr
    assert "ban fewer strings or lower min_tokens" in result.stderr


def test_presets_show_prints_toml_that_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(
        "typical_p = 0.9\ntop_n_sigma = 1.5\nxtc_probability = 0.5\ndry_multiplier = 0.8\n"
        'dry_sequence_breakers = ["\\n", "."]\nlogit_bias = { "50256" = -100, " the" = 2.5, "a\\"b" = 1 }\n'
        'ban = "As an AI"\nmin_tokens = 3\n'
    )
    shown = run("presets", "show", "--file", str(path))
    assert shown.exit_code == 0, shown.output
    printed = tomllib.loads(shown.stdout)
    assert printed == {k: v for k, v in read_preset_file(path).as_dict().items() if v is not None}
    assert printed["logit_bias"] == {"50256": -100.0, " the": 2.5, 'a"b': 1.0}
    shown = run("presets", "show", "fiction")
    assert "dry_multiplier = 0.8" in shown.stdout and "xtc_probability = 0.5" in shown.stdout


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("typical_p = 1.5", "typical_p: must be in (0, 1]"),
        ('logit_bias = { "5" = "up" }', "logit_bias: the bias of '5' must be a finite number"),
        ("logit_bias = 3", "logit_bias: expected a table of TOKEN = BIAS"),
        ("ban = [1]", "ban: expected a string or a list of strings"),
        ("dry_allowed_length = 1.5", "dry_allowed_length: expected an integer"),
    ],
)
def test_bad_preset_keys_name_file_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    result = run("presets", "show", "--file", str(path))
    assert result.exit_code == 2 and str(path) in result.stderr and fragment in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
