"""compare-presets: metrics on hand-made sequences, batching, and the command end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.analysis.text_metrics import (
    cross_sample_diversity,
    distinct_n,
    divergence_index,
    mean_logprob,
    mean_pairwise_overlap,
    perplexity,
    repetition_rate,
)
from llmsample.cli import main
from llmsample.engine.loop import generate, generate_rows, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.events import RunStats, Summary
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.presets import discover


def test_distinct_n() -> None:
    assert distinct_n([1, 2, 3, 4], 1) == 1.0
    assert distinct_n([1, 1, 1, 1], 1) == 0.25
    assert distinct_n([1, 2, 1, 2, 1], 2) == 2 / 4  # (1,2) (2,1) (1,2) (2,1)
    assert distinct_n([1], 2) == 0.0


def test_repetition_rate() -> None:
    assert repetition_rate([1, 2, 3, 4, 5, 6]) == 0.0
    assert repetition_rate([1, 2, 3, 4, 1, 2, 3, 4]) == 1 / 5  # 5 four-grams, (1,2,3,4) repeats once
    assert repetition_rate([7] * 10) == 6 / 7


def test_perplexity_from_known_logprobs() -> None:
    assert mean_logprob([0.5, 0.5]) == pytest.approx(math.log(0.5))
    assert perplexity(mean_logprob([0.25, 0.25, 0.25])) == pytest.approx(4.0)
    assert perplexity(mean_logprob([1.0])) == 1.0


def test_divergence_and_cross_sample_numbers() -> None:
    assert divergence_index([1, 2, 3], [1, 2, 3]) is None
    assert divergence_index([1, 2, 4], [1, 2, 3]) == 2
    assert divergence_index([1, 2], [1, 2, 3]) == 2
    assert mean_pairwise_overlap([[1, 2, 3], [1, 2, 3]]) == 1.0
    assert mean_pairwise_overlap([[1, 2], [3, 4]]) == 0.0
    assert cross_sample_diversity([[1, 2, 3], [1, 2, 3]]) == 0.5
    assert cross_sample_diversity([[1, 2, 3], [4, 5, 6]]) == 1.0


def test_batched_samples_equal_samples_run_alone(tiny_lm) -> None:
    ids = encode_prompt(tiny_lm, "w5 w6 w7", raw=True)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, repetition_penalty=1.2, max_tokens=25)
    seeds = [10, 11, 12, 13]
    stats = [RunStats("t", "t", s) for s in seeds]
    batched: dict[int, list[int]] = {s: [] for s in range(4)}
    for row, item in generate_rows(tiny_lm, ids, cfg, stats, seeds):
        if not isinstance(item, Summary):
            batched[row].append(item.token_id)
    for row, seed in enumerate(seeds):
        alone, _ = run_to_end(
            generate(
                tiny_lm, ids, SamplingConfig(**{**cfg.as_dict(), "stop": (), "seed": seed}), RunStats("t", "t", seed)
            )
        )
        assert batched[row] == [e.token_id for e in alone]
    assert len({tuple(v) for v in batched.values()}) > 1


def compare_args(model: Path, *extra: str) -> list[str]:
    return ["compare-presets", "-m", str(model), "--raw", "-p", "w3 w4", "-n", "12", "-q", *extra]


def test_compare_jsonl_records(tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(
        main, compare_args(tiny_model_dir, "--samples", "2", "--format", "jsonl", "--seed", "5")
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == len(discover()) * 2  # every built-in preset x 2 samples
    keys = {"preset", "sample", "seed", "text", "tokens", "tokens_per_s", "mean_logprob", "perplexity", "mean_entropy",
            "distinct_1", "distinct_2", "repetition_rate", "divergence_index"}  # fmt: skip
    assert all(set(r) == keys for r in records)
    assert {(r["sample"], r["seed"]) for r in records} == {(0, 5), (1, 6)}
    deterministic = [r for r in records if r["preset"] == "deterministic"]
    assert deterministic[0]["text"] == deterministic[1]["text"] and deterministic[0]["divergence_index"] is None
    assert deterministic[0]["mean_entropy"] == 0.0


def test_compare_rerun_reproduces(tiny_model_dir: Path) -> None:
    args = compare_args(tiny_model_dir, "--presets", "creative,balanced", "--format", "jsonl")
    first, second = (CliRunner().invoke(main, args).stdout for _ in range(2))
    strip = [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in first.splitlines()]
    assert strip == [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in second.splitlines()]


@pytest.mark.parametrize("columns", ["60", "120"])
def test_compare_table_renders_plain_in_narrow_terminals(tiny_model_dir: Path, columns: str) -> None:
    result = CliRunner().invoke(
        main, compare_args(tiny_model_dir, "--samples", "2"), env={"NO_COLOR": "1", "COLUMNS": columns}
    )
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= int(columns)
    for header in ("balanced", "tokens", "dist-2", "diverges"):
        assert header in result.stdout


def test_unknown_preset_fails_before_loading_the_model() -> None:
    result = CliRunner().invoke(
        main, ["compare-presets", "-m", "/nonexistent", "-p", "x", "--presets", "creative,nope"]
    )
    assert result.exit_code == 2 and "unknown preset 'nope'" in result.stderr and "/nonexistent" not in result.stderr


@pytest.mark.model
def test_creative_has_higher_entropy_than_deterministic(default_lm) -> None:
    from llmsample.analysis.preset_comparison import compare
    from llmsample.sampling.presets import load

    ids = encode_prompt(default_lm, "Write a short story about a robot.")
    configs = {name: load(name)[1] for name in ("creative", "deterministic")}
    runs = compare(default_lm, ids, configs, samples=2, seed=0, max_tokens=30).runs
    entropy = {run.preset: run.metrics.mean_entropy for run in runs}
    assert entropy["creative"] > entropy["deterministic"] == 0.0
