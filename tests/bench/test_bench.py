"""``llmsample bench`` end to end on a tiny model: every figure present, the JSON and the table agree.
Its JSON keys stay those of earlier result files, and ``--out`` is checked before the minutes of
measuring."""

from __future__ import annotations

import errno
import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmsample.bench.single
from llmsample.bench.costs import STAGE_SETTINGS
from llmsample.bench.results import (
    Bandwidth,
    BenchResults,
    Generate,
    Inspection,
    Machine,
    Speculation,
    StageCost,
    StartUp,
    results_table,
)
from llmsample.cli import main


@pytest.mark.slow  # the single-stream run times a warm start in a process of its own
def test_bench_writes_every_figure(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "results"
    result = CliRunner().invoke(
        main,
        ["bench", "--model", str(tiny_model_dir), "--runs", "1", "--tokens", "8", "--no-cold", "--out", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (path,) = out.glob("bench-cpu-float32-*.json")
    figures = json.loads(path.read_text())
    assert [row["workload"] for row in figures["generate"]] == [
        f"{p} / {s}" for p in ("chat", "story", "code-rewrite") for s in ("greedy", "balanced")
    ]
    assert all(row["ours_tok_s"] > 0 and row["ratio"] > 0 and row["ttft_s"] > 0 for row in figures["generate"])
    assert all(row["loaded_reference_tok_s"] > 0 and row["loaded_ratio"] > 0 for row in figures["generate"])
    assert figures["speculative"]["speedup_over_plain"] > 0
    assert 0 < figures["inspection"]["pipeline_share_of_step"] < 1
    stages = {cost["stage"]: cost for cost in figures["inspection"]["stages"]}  # each newer stage's cost a step
    assert list(stages) == list(STAGE_SETTINGS) and all(cost["s_per_step"] > 0 for cost in stages.values())
    assert "mirostat" in result.output  # a row a stage under the table
    assert 0 < figures["warm_load_s"] < figures["warm_start_s"]
    assert figures["bandwidth"]["copy_gb_s"] > 0 and figures["peak_rss_mb"] > 0
    assert "warm start:" in result.output and "ratio" in result.output  # the table, however wrapped
    # At the defaults (--dtype auto, eager) against transformers' own: a float32 checkpoint is
    # float32 on both sides, so the float32 reference is that one row.
    (defaults,) = figures["defaults"]
    assert defaults["ours_dtype"] == defaults["reference_dtype"] == "float32" and defaults["ratio"] > 0
    assert "transformers default (float32)" in defaults["workload"]


def made_up_results(cold: bool) -> BenchResults:
    row = Generate("chat / greedy", 100.0, 50.0, 2.0, 0.01, 3, 40.0, 2.5)
    return BenchResults(
        machine=Machine("Linux", "x86_64", "AVX2", 4, "3.11.7", "2.13.0", "5.0.0"),
        model="tiny", device="cpu", dtype="float32", new_tokens=8, runs=3, compile=False,
        start_up=StartUp(start_s=3.0, load_s=0.5), generate=(row,), compile_s=None,
        speculative=Speculation("code-rewrite / greedy, ngram", 120.0, 60.0, 2.0, None, 3, 1.2, 0.75, 2.5),
        inspection=Inspection(100.0, 90.0, 0.9, 0.0005, 0.05, (StageCost("top-a", 0.0006, 0.0001, 0.01),)),
        bandwidth=Bandwidth(20.0, 10.0, 2000.0, 100.0, 0.05),
        cold=cold, cold_load_s=None, peak_rss_mb=900.0,
    )  # fmt: skip


# The keys (in order) of the result files written before the figures were typed.
TOP_KEYS = ["machine", "model", "device", "dtype", "new_tokens", "runs", "compile", "warm_start_s", "warm_load_s",
            "generate", "compile_s", "speculative", "inspection", "bandwidth", "peak_rss_mb"]  # fmt: skip
ROW_KEYS = ["workload", "ours_tok_s", "reference_tok_s", "ratio", "ttft_s", "runs"]
GENERATE_KEYS = [*ROW_KEYS, "loaded_reference_tok_s", "loaded_ratio"]  # added after, at the end
SECTION_KEYS = {
    "machine": ["platform", "processor", "cpu_capability", "threads", "python", "torch", "transformers"],
    "speculative": [*ROW_KEYS, "speedup_over_plain", "acceptance_rate", "tokens_per_pass"],
    "inspection": ["text_tok_s", "jsonl_tok_s", "jsonl_over_text", "pipeline_s_per_step", "pipeline_share_of_step",
                   "stages"],
    "bandwidth": ["copy_gb_s", "weight_mb", "bound_tok_s", "best_greedy_tok_s", "fraction_of_bound"],
}


def test_the_json_keeps_the_keys_of_earlier_results() -> None:
    document = made_up_results(cold=False).to_dict()
    assert list(document) == TOP_KEYS
    assert [list(row) for row in document["generate"]] == [GENERATE_KEYS]
    assert {name: list(document[name]) for name in SECTION_KEYS} == SECTION_KEYS
    assert document["warm_start_s"] == 3.0 and document["warm_load_s"] == 0.5
    assert json.loads(json.dumps(document)) == document
    with_cold = made_up_results(cold=True).to_dict()  # measured, but no GGUF shipped: null
    assert list(with_cold) == [*TOP_KEYS[:-1], "cold_load_s", "peak_rss_mb"] and with_cold["cold_load_s"] is None


def test_the_table_reads_the_figures() -> None:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None)
    console.print(results_table(made_up_results(cold=True)))
    text = console.export_text()
    for figure in (
        "100.0",
        "50.0",
        "2.00",
        "40.0",
        "2.50",
        "0.01",
        "1.20x (acceptance 75%)",
        "3.00 s = 2.50 s + 0.50 s",
        "+0.10 ms (+1.0% of a step)",
        "- s",
    ):
        assert figure in text


@pytest.fixture
def no_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark started although --out cannot be written")

    monkeypatch.setattr(llmsample.bench.single, "run_benchmark", refuse)


def test_out_under_a_file_fails_before_the_benchmark(tmp_path: Path, no_benchmark: None) -> None:
    (tmp_path / "file").write_text("")
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "file" / "results")])
    assert result.exit_code == 2 and result.stdout == ""
    assert f"{tmp_path / 'file'} is not a directory" in result.stderr and result.stderr.count("\n") == 1


def test_unwritable_out_fails_before_the_benchmark(
    tmp_path: Path, no_benchmark: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> None:  # root ignores permission bits: fake it
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "new" / "results")])
    assert result.exit_code == 2 and result.stdout == ""
    assert f"cannot write in {tmp_path} (Read-only file system)" in result.stderr
    assert not (tmp_path / "new").exists()


def test_batch_section_writes_its_rows(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "results"
    args = ["bench", "--model", str(tiny_model_dir), "--device", "cpu", "--batch-sizes", "1,3", "--runs", "1",
            "--tokens", "8", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False, env={"COLUMNS": "160"})  # the table unwrapped
    assert result.exit_code == 0, result.output
    (path,) = out.glob("bench-batch-cpu-float32-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [row["batch_size"] for row in rows] == [1, 3]
    assert all(row["ours_tok_s"] > 0 and row["reference_tok_s"] > 0 and 0 < row["model_share"] <= 1 for row in rows)
    assert all(row["loaded_reference_tok_s"] > 0 and row["loaded_ratio"] > 0 for row in rows)
    assert "vs batch 1" in result.output


def test_the_reference_of_its_own_load_is_the_plain_transformers_model(tiny_model_dir) -> None:
    """Our load reorders float32 weights for oneDNN; transformers' users get plain ``nn.Linear``s."""
    import torch

    from llmsample.bench.sides import as_transformers_loads
    from llmsample.models.loading import load_model
    from llmsample.models.prepacked import PrepackedLinear

    lm = load_model(str(tiny_model_dir), "cpu", "float32")
    loaded = as_transformers_loads(lm, str(tiny_model_dir), lm.dtype)
    assert isinstance(lm.model.lm_head, PrepackedLinear)
    assert not any(isinstance(m, PrepackedLinear) for m in loaded.model.modules())
    assert loaded.model is not lm.model and loaded.dtype == torch.float32 and loaded.compiled is None


def test_batch_sizes_must_be_a_list(tiny_model_dir) -> None:
    result = CliRunner().invoke(main, ["bench", "--batch-sizes", "1,x"])
    assert result.exit_code == 2 and "batch sizes" in result.output


def test_workloads_section_writes_its_rows(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "results"
    args = ["bench", "--model", str(tiny_model_dir), "--device", "cpu", "--workloads", "--runs", "1",
            "--tokens", "8", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("bench-workloads-cpu-float32-*.json")
    rows = json.loads(path.read_text())["rows"]
    assert [row["baseline"] for row in rows] == ["one seed, one setting", "no drafting"]
    assert all(row["tok_s"] > 0 and row["baseline_tok_s"] > 0 and row["ratio"] > 0 for row in rows)


def test_a_failed_warm_start_says_why_in_one_line(tmp_path: Path) -> None:
    """The fresh process's own error, not "returned non-zero exit status 1"."""
    from llmsample.bench.startup import warm_start
    from llmsample.errors import RuntimeFailure

    with pytest.raises(RuntimeFailure, match=r"warm start's fresh process failed: .*missing is not a directory") as caught:
        warm_start(str(tmp_path / "missing"), "cpu", "auto")
    assert "\n" not in str(caught.value)
