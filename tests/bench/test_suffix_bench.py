"""``llmsample bench --suffix`` end to end on a tiny model (few requests): the three workloads, the
drafting side against the plain one, the JSON and the table agree; ``--backend llama.cpp`` is
allowed with it (a workload through the engine) and other sections are still refused there."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import llmsample.bench.suffix_drafting
from llmsample.cli import main
from llmsample.commands.bench import check_sections
from llmsample.errors import UserError

ROW_KEYS = ["workload", "tok_s", "plain_tok_s", "ratio", "acceptance_rate", "tokens_per_pass", "bar"]


def test_bench_suffix_writes_every_workload(tiny_model_dir, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llmsample.bench.suffix_drafting, "RECORDS", 4)
    monkeypatch.setattr(llmsample.bench.suffix_drafting, "CHATS", 2)
    monkeypatch.setattr(llmsample.bench.suffix_drafting, "EDITS", 2)
    monkeypatch.setattr(llmsample.bench.suffix_drafting, "EDIT_CAP", 12)
    monkeypatch.setattr(llmsample.bench.suffix_drafting, "RECORD_CAP", 12)
    out = tmp_path / "results"
    args = ["bench", "--suffix", "-m", str(tiny_model_dir), "--runs", "2", "--tokens", "8", "--out", str(out)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("bench-suffix-cpu-float32-*.json")
    document = json.loads(path.read_text())
    assert document["backend"] == "transformers" and document["runs"] == 2
    records, _, edits, _, chats, _ = document["rows"]
    assert [list(row) for row in document["rows"]] == [ROW_KEYS] * 6
    assert records["workload"].startswith("4 records") and chats["workload"].startswith(
        "2 open chat prompts of varied lengths"
    )
    assert edits["workload"].startswith("2 edits of the same code")
    assert [row["workload"][-9:] for row in document["rows"]] == ["(batch 1)", "(batch 4)"] * 3
    assert [row["bar"] for row in document["rows"]] == [1.5, 1.5, 1.5, 1.5, 0.95, 0.95]
    for row in document["rows"]:
        assert row["tok_s"] > 0 and row["plain_tok_s"] > 0 and row["ratio"] > 0
        assert 0 <= row["acceptance_rate"] <= 1 and row["tokens_per_pass"] >= 1  # the drafting side drafted
    assert "records" in result.output and f"{records['ratio']:.2f}" in result.output


def options(**chosen: object) -> dict[str, object]:
    none = {"batch_sizes": None, "workloads": False, "quant": None, "startup": False, "suffix": False, "serve": False,
            "serve_peers": False, "multi_turn": False, "constraints": False, "sweep": False, "vs_llamacpp": False,
            "contended": False}  # fmt: skip
    return {**none, "backend": "llama.cpp", "dtype": "auto", "compile_model": False, **chosen}


def test_suffix_runs_on_llama_cpp_and_other_sections_do_not() -> None:
    check_sections(options(suffix=True))
    with pytest.raises(UserError, match="leave out --workloads"):
        check_sections(options(workloads=True))
    with pytest.raises(UserError, match="separate benchmarks"):
        check_sections(options(suffix=True, startup=True))


def test_the_sections_against_llama_cpp_python_run_the_gguf_on_llama_cpp() -> None:
    for section in ("vs_llamacpp", "contended"):
        check_sections(options(**{section: True}))
        check_sections(options(**{section: True, "backend": "auto"}))
        flag = f"--{section.replace('_', '-')}"
        with pytest.raises(UserError, match=f"{flag} runs the GGUF's own weights on llama.cpp.*--backend transformers"):
            check_sections(options(**{section: True, "backend": "transformers"}))
        with pytest.raises(UserError, match="leave out --compile"):
            check_sections(options(**{section: True, "compile_model": True}))
    with pytest.raises(UserError, match="separate benchmarks"):
        check_sections(options(vs_llamacpp=True, contended=True))
