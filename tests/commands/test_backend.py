"""``--backend`` where llama-cpp-python is missing: one line naming the extra, and ``auto`` keeps
to transformers (these run with or without the extra installed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.models import llamacpp


def test_llama_cpp_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    result = CliRunner().invoke(main, ["generate", "-p", "hi", "-m", str(model), "--backend", "llama.cpp"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and "pip install 'llmsample[llamacpp]'" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("spec", "device", "plain", "installed", "expected"),
    [
        ("m.gguf", "cpu", True, True, "llama.cpp"),
        ("m.gguf", "cpu", True, False, "transformers"),  # without the extra: today's conversion path
        ("m.gguf", "cuda", True, True, "transformers"),
        ("m.gguf", "cpu", False, True, "transformers"),  # --dtype, --compile, --quantize... asked for
        ("some/hub-id", "cpu", True, True, "transformers"),
        (None, "cpu", True, True, "transformers"),  # the default model: --backend llama.cpp asks for it
    ],
)
def test_auto_picks_llama_cpp_for_a_gguf_on_a_cpu(
    spec: str, device: str, plain: bool, installed: bool, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: installed)
    assert llamacpp.choose_backend("auto", spec, torch.device(device), plain) == expected
    assert llamacpp.choose_backend("transformers", spec, torch.device(device), plain) == "transformers"


def test_llama_cpp_on_another_device_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.errors import UserError

    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    with pytest.raises(UserError, match="runs on the CPU here, not cuda"):
        llamacpp.choose_backend("llama.cpp", "m.gguf", torch.device("cuda"), True)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--workloads"], "--workloads"),
        (["--batch-sizes", "1,8"], "--batch-sizes"),
        (["--dtype", "float32"], "--dtype"),
    ],
)
def test_bench_on_llama_cpp_is_a_section_of_its_own(extra: list[str], named: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--backend", "llama.cpp", "--out", str(tmp_path), *extra])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and f"leave out {named}" in result.stderr, result.stderr


def test_llama_cpp_runs_leave_openmp_waiting_to_libgomp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """ggml's barriers are OpenMP barriers: told to sleep (``PASSIVE``) its threads ran the
    default model 3x slower on a quiet 2-core machine (30 against 100 tok/s)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    CliRunner().invoke(main, ["bench", "--backend", "llama.cpp", "--out", str(tmp_path), "--workloads"])
    assert "OMP_WAIT_POLICY" not in os.environ
