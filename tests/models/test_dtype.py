"""``--dtype auto``: the checkpoint's own dtype where the device computes it natively and fast,
float32 elsewhere; the default model counts as the bf16 checkpoint it is upstream; every summary
says which device and dtype a run used."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from llmsample.engine.loop import generate, run_to_end
from llmsample.events import RunStats
from llmsample.models import device as device_module
from llmsample.models.device import checkpoint_dtype, resolve_dtype
from llmsample.models.gguf_to_hf import DEFAULT_DTYPE, record_dtype
from llmsample.models.loading import load_model
from llmsample.render.stream import summary_lines
from llmsample.sampling.config import SamplingConfig

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")


@pytest.mark.parametrize(
    ("checkpoint", "device", "native_bf16", "cuda_bf16", "expected"),
    [
        ("bfloat16", CPU, True, None, torch.bfloat16),  # AVX512-BF16 / AMX
        ("bfloat16", CPU, False, None, torch.float32),  # emulated bf16: slow prefill
        ("float16", CPU, True, None, torch.float32),
        ("float32", CPU, True, None, torch.float32),
        (None, CPU, True, None, torch.float32),  # a config that does not say
        ("bfloat16", CUDA, False, True, torch.bfloat16),
        ("bfloat16", CUDA, False, False, torch.float16),  # pre-Ampere GPUs
        ("float16", CUDA, False, True, torch.float16),
        ("float32", CUDA, False, True, torch.float32),
        ("bfloat16", MPS, True, None, torch.float32),
    ],
)
def test_auto(monkeypatch, checkpoint, device, native_bf16, cuda_bf16, expected) -> None:
    monkeypatch.setattr(device_module, "native_bf16_cpu", lambda: native_bf16)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: cuda_bf16)
    assert resolve_dtype("auto", device, checkpoint) == expected


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_kept(name: str) -> None:
    assert resolve_dtype(name, CPU, "bfloat16") == getattr(torch, name)


def test_the_checkpoint_dtype_comes_from_its_config() -> None:
    assert checkpoint_dtype(SimpleNamespace(dtype=torch.bfloat16)) == "bfloat16"
    assert checkpoint_dtype(SimpleNamespace(dtype=None, torch_dtype="float16")) == "float16"
    assert checkpoint_dtype(SimpleNamespace()) is None
    # The default model is upstream's bf16 checkpoint, even where an older conversion recorded float32.
    assert checkpoint_dtype(SimpleNamespace(dtype="float32"), default_model=True) == DEFAULT_DTYPE == "bfloat16"


def test_the_conversion_records_the_dtype(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "dtype": "float32", "torch_dtype": "float32"}))
    record_dtype(config, "bfloat16")
    assert json.loads(config.read_text()) == {"model_type": "llama", "dtype": "bfloat16"}


def bf16_checkpoint(source: Path, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


@pytest.mark.parametrize("native", [True, False])
def test_load_model_runs_a_bf16_checkpoint_as_the_cpu_allows(tiny_model_dir, tmp_path, monkeypatch, native) -> None:
    monkeypatch.setattr(device_module, "native_bf16_cpu", lambda: native)
    directory = bf16_checkpoint(tiny_model_dir, tmp_path / "bf16")
    lm = load_model(str(directory), "cpu", "auto")
    assert lm.dtype == (torch.bfloat16 if native else torch.float32) == next(lm.model.parameters()).dtype
    assert load_model(str(tiny_model_dir), "cpu", "auto").dtype == torch.float32  # a float32 checkpoint
    _, summary = run_to_end(generate(lm, torch.tensor([[5, 9, 3]]), SamplingConfig(max_tokens=3, seed=1),
                                     RunStats("tiny", "test", 1)))  # fmt: skip
    name = "bfloat16" if native else "float32"
    assert summary.facts.device == "cpu" and summary.facts.dtype == name
    assert summary.to_dict()["dtype"] == name  # in the JSONL summary
    assert summary_lines(summary, None).endswith(f"cpu {name}")
