"""``bench --startup``: the clock stops at a process's first byte (not its exit), the table's
ratio is the two rates', and the section refuses what it cannot measure in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmsample.bench.first_token import StartupBench, first_byte_s, rotations, table
from llmsample.cli import main


def test_the_clock_stops_at_the_first_byte() -> None:
    child = "import sys, time; time.sleep(0.4); print('x', flush=True); time.sleep(1.5)"
    took = first_byte_s([sys.executable, "-c", child], {})
    assert took is not None and 0.4 <= took < 1.5
    assert first_byte_s([sys.executable, "-c", "print('x'); raise SystemExit(3)"], {}) is None


def test_every_side_leads_a_run_in_turn() -> None:
    orders = rotations(["a", "b", "c"], 4)
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_the_table_and_the_ratio() -> None:
    result = StartupBench(3, "m.gguf", {"cold llama.cpp": 2.5, "warm engine": 0.25, "llama-cpp-python alone": None},
                          tokens=256, together_tokens_per_s=120.0, in_turn_tokens_per_s=40.0)  # fmt: skip
    lines = table(result).splitlines()
    assert lines[0] == "seconds to the first token from a fresh process, median of 3:"
    assert lines[1:4] == ["  cold llama.cpp           2.50 s", "  warm engine              0.25 s",
                          "  llama-cpp-python alone   failed"]  # fmt: skip
    assert lines[4].endswith("together 120.0 tok/s, one after another 40.0 tok/s (3.00x)")


def test_the_figures_are_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import llmsample.bench.first_token

    monkeypatch.setattr(llmsample.bench.first_token, "run_startup_benchmark",
                        lambda runs, tokens, log: StartupBench(runs, "m.gguf", {"warm engine": 0.2}, tokens=tokens))  # fmt: skip
    done = CliRunner().invoke(main, ["bench", "--startup", "--runs", "2", "--out", str(tmp_path)])
    assert done.exit_code == 0, done.output
    (path,) = tmp_path.iterdir()
    document = json.loads(path.read_text())
    assert document["kind"] == "bench-startup" and document["runs"] == 2 and document["tokens"] == 64
    assert "warm engine              0.20 s" in done.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--startup", "--workloads"], "--workloads and --startup are separate benchmarks"),
        (["--startup", "-m", "some/model"], "--startup measures the default model"),
    ],
)
def test_refusals_are_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1 and fragment in result.stderr
