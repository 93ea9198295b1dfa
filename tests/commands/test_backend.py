"""``--backend`` where llama-cpp-python is missing: one line naming the extra, and ``auto`` keeps
to transformers (these run with or without the extra installed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.cli import main
from llmsample.models import llamacpp_load as llamacpp
from llmsample.models.plan import Asked, plan


def test_llama_cpp_without_the_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    result = CliRunner().invoke(main, ["generate", "-p", "hi", "-m", str(model), "--backend", "llama.cpp"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.count("\n") == 1 and "pip install 'llmsample[llamacpp]'" in result.stderr, result.stderr


SPECS = {
    "gguf": "m.gguf",
    "default": None,
    "hub id": "some/hub-id",
    "convertible folder": "CONVERTIBLE",
    "word-level folder": "WORDLEVEL",  # the suite's tiny models: llama.cpp has no word-level tokenizer
}


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("plain", [True, False])  # False: --dtype, --compile, --quantize, --device-map or --tp
@pytest.mark.parametrize("installed", [True, False])
def test_auto_picks_llama_cpp_on_a_cpu_for_what_it_can_run(
    kind: str, device: str, plain: bool, installed: bool, tmp_path: Path, tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    convertible = tmp_path / "llama"
    convertible.mkdir()
    (convertible / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (convertible / "model.safetensors").write_bytes(b"")
    (convertible / "tokenizer.json").write_text('{"model": {"type": "BPE"}, "pre_tokenizer": {"type": "ByteLevel"}}')
    spec = {"CONVERTIBLE": str(convertible), "WORDLEVEL": str(tiny_model_dir)}.get(SPECS[kind], SPECS[kind])
    monkeypatch.setattr(llamacpp, "installed", lambda: installed)
    runnable = kind in ("gguf", "default", "convertible folder")
    on_llama_cpp = runnable and device == "cpu" and plain and installed
    chosen = plan(Asked("auto", spec, torch.device(device), simple=plain))
    assert (chosen.backend == "llama.cpp") == on_llama_cpp and chosen.why  # else torch or transformers, saying why
    assert plan(Asked("transformers", spec, torch.device(device), simple=plain)).backend == "transformers"


def test_llama_cpp_on_what_it_cannot_run_says_why(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.errors import UserError

    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    with pytest.raises(UserError, match=r"tokenizer.*use --backend transformers"):
        plan(Asked("llama.cpp", str(tiny_model_dir), torch.device("cpu")))
    with pytest.raises(UserError, match="neither"):
        plan(Asked("llama.cpp", "some/hub-id", torch.device("cpu")))


def test_llama_cpp_on_another_device_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmsample.errors import UserError

    monkeypatch.setattr(llamacpp, "installed", lambda: True)
    with pytest.raises(UserError, match="runs on the CPU here, not cuda"):
        plan(Asked("llama.cpp", "m.gguf", torch.device("cuda")))


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


class Chosen(Exception):
    pass


@pytest.mark.parametrize(
    ("options", "plain"),
    [
        ({}, True),
        ({"dtype_name": "float32"}, False),
        ({"compile": True}, False),
        ({"quantize": "int8"}, False),
        ({"tensor_parallel": True}, False),
        ({"placement": "cpu"}, False),
    ],
)
def test_every_transformers_only_option_keeps_auto_off_llama_cpp(
    options: dict, plain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``load_model`` tells the plan for each option that only transformers runs."""
    from llmsample.models import plan
    from llmsample.models.loading import load_model
    from llmsample.models.placement import Placement

    seen = []

    def record(asked: plan.Asked) -> plan.Plan:
        seen.append(asked.simple and not asked.dtype_given)
        raise Chosen

    monkeypatch.setattr(plan, "plan", record)
    if "placement" in options:
        options = {**options, "placement": Placement(options["placement"])}
    with pytest.raises(Chosen):
        load_model(None, "auto", backend="auto", **options)
    assert seen == [plain]


def test_verbose_says_which_backend_runs_the_model_and_why(tiny_model_dir: Path) -> None:
    """models/plan.py's reason, on stderr; stdout keeps only the text."""
    args = ["generate", "-m", str(tiny_model_dir), "-p", "w3", "-n", "2", "--raw", "-q", "--local", "--verbose"]
    result = CliRunner().invoke(main, [*args, "--backend", "transformers"])
    assert result.exit_code == 0, result.output
    assert f"llmsample: transformers runs {tiny_model_dir} (float32): asked for (--backend, or LLMSAMPLE_BACKEND)\n" in result.stderr
    assert "llmsample:" not in result.stdout
    auto = CliRunner().invoke(main, [*args, "--device", "cpu", "--backend", "auto"])
    assert auto.exit_code == 0, auto.output
    assert "a local checkpoint llmsample's own torch forward runs on the CPU" in auto.stderr, auto.stderr
