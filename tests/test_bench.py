"""``llmsample bench`` end to end on a tiny model: every figure present, the JSON and the table agree."""

from __future__ import annotations

import json

from click.testing import CliRunner

from llmsample.cli import main


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
    assert figures["speculative"]["speedup_over_plain"] > 0
    assert 0 < figures["inspection"]["pipeline_share_of_step"] < 1
    assert 0 < figures["warm_load_s"] < figures["warm_start_s"]
    assert figures["bandwidth"]["copy_gb_s"] > 0 and figures["peak_rss_mb"] > 0
    assert "warm start:" in result.output and "ratio" in result.output  # the table, however wrapped
