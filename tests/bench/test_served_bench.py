"""``llmsample bench --serve`` and ``--multi-turn`` end to end on a tiny model (servers and batch
processes of their own: slow), the lean client's parsing, the tables, and the refusals that come
before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import llmsample.commands.bench
from llmsample.bench.multi_turn import MultiTurn, Turn
from llmsample.bench.multi_turn import table as multi_turn_table
from llmsample.bench.serve_load import ServeLoad, Side, decode_rate, percentiles
from llmsample.bench.serve_load import table as serve_table
from llmsample.bench.served import Streamed, text_of
from llmsample.cli import main
from tests.conftest import make_tiny_model, with_chat_template


@pytest.mark.slow
def test_bench_serve_writes_both_sides(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["bench", "--serve", "-m", str(tiny_model_dir), "--runs", "1", "--tokens", "8", "--clients", "2",
            "--requests", "3", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = tmp_path.glob("bench-serve-cpu-auto-*.json")
    document = json.loads(path.read_text())
    assert document["kind"] == "bench-serve" and document["backend"] == "transformers"  # the suite's pinned backend
    assert (document["clients"], document["requests"], document["new_tokens"], document["runs"]) == (2, 3, 8, 1)
    (run,) = document["rounds"]
    assert run["batch"]["tokens"] == run["serve"]["tokens"] == 24  # min_tokens = max_tokens: every request as long
    assert run["serve"]["ttft_s"]["p50"] <= run["serve"]["latency_s"]["p95"]
    assert document["ratio_median"] > 0 and document["decode_ratio_median"] > 0
    assert "ratio (median of the rounds)" in result.stdout


@pytest.mark.slow
def test_bench_multi_turn_keeps_the_conversation_in_the_cache(tmp_path: Path) -> None:
    model = with_chat_template(make_tiny_model(tmp_path / "chat"), "{% for m in messages %}{{ m['content'] }} {% endfor %}")
    args = ["bench", "--multi-turn", "-m", str(model), "--runs", "1", "--tokens", "8", "--turns", "2",
            "--out", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = (tmp_path / "out").glob("bench-multi-turn-*.json")
    document = json.loads(path.read_text())
    cached, cold = document["cached"], document["cold"]
    assert [turn["turn"] for turn in cached] == [turn["turn"] for turn in cold] == [1, 2]
    assert cached[1]["prompt_tokens"] > cached[0]["prompt_tokens"]  # the history is resent
    assert cached[1]["cached_tokens"] > 0 and all(turn["cached_tokens"] == 0 for turn in cold)
    assert document["last_turn_cold_over_cached"] > 0 and set(document["last_over_first_ttft"]) == {"cached", "cold"}
    assert "TTFT cache off" in result.stdout


def test_the_client_reads_completions_and_chat_chunks() -> None:
    assert text_of(b'data: {"choices": [{"index": 0, "text": "Paris"}]}') == "Paris"
    assert text_of(b'data: {"choices": [{"index": 0, "delta": {"content": "Par"}}]}') == "Par"
    assert text_of(b'data: {"choices": [], "usage": {"completion_tokens": 2}}') == ""
    assert text_of(b"data: [DONE]") == text_of(b"HTTP/1.1 200 OK\r") == ""
    chunks = b'data: {"choices": [{"delta": {"content": "Pa"}}]}\n\ndata: {"choices": [{"delta": {"content": "ris"}}]}\n'
    assert Streamed(0.1, 0.2, {}, chunks).text == "Paris"


def test_rates_and_percentiles() -> None:
    # 3 tokens after the first over the longest first-to-end span (2 s), both sides alike
    assert decode_rate([(0.5, 2.5, 3), (1.0, 2.0, 2)]) == pytest.approx(1.5)
    assert percentiles([0.3]) == {"p50": 0.3, "p95": 0.3}
    assert percentiles([float(n) for n in range(1, 21)])["p95"] == pytest.approx(19.05)


def test_the_tables_read_the_figures() -> None:
    ttft, latency = {"p50": 0.5, "p95": 0.75}, {"p50": 3.0, "p95": 4.0}
    load = ServeLoad(16, 32, 64, [Side(1024, 10.0, 102.4, 110.0)], [Side(1024, 8.0, 128.0, 121.0, ttft, latency)])
    text = serve_table(load)
    assert "128.0/102.4" in text and "1.250x" in text and "1.100x" in text and "0.50 s, 0.75 s" in text
    turns = [[Turn(1, 0.2, 100, 0), Turn(2, 0.25, 200, 150)]], [[Turn(1, 0.2, 100, 0), Turn(2, 0.5, 200, 0)]]
    conversation = MultiTurn(2, 32, *turns)
    assert conversation.last_turn_ratio == 2.0 and conversation.growth(conversation.cold) == 2.5
    assert "cache on 1.25x, off 2.50x; last turn off / on 2.00x" in multi_turn_table(conversation)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--clients", "4"], "--clients is an option of --serve"),
        (["--multi-turn", "--requests", "4"], "--requests is an option of --serve"),
        (["--serve", "--turns", "3"], "--turns is an option of --multi-turn"),
        (["--serve", "--multi-turn"], "--serve and --multi-turn are separate benchmarks"),
        (["--multi-turn", "--compile"], "refuses --compile"),
        (["--constraints", "--startup"], "--startup and --constraints are separate benchmarks"),
    ],
)
def test_refusals_are_one_line_before_anything_loads(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr


@pytest.mark.parametrize(("section", "missing", "fragment"), [
    ("--serve", "uvicorn", "pip install 'llmsample[serve]'"),
    ("--constraints", "jsonschema", "pip install jsonschema"),
])  # fmt: skip
def test_a_missing_library_is_named_first(
    section: str, missing: str, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llmsample.commands.bench, "_importable", lambda name: name != missing)
    result = CliRunner().invoke(main, ["bench", section, "--out", str(tmp_path)])
    assert result.exit_code == 2 and fragment in result.stderr and result.stderr.count("\n") == 1
