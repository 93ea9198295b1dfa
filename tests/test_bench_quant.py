"""The quantization benchmark's bookkeeping (the benchmark itself runs with `python -m llmsample.bench_quant`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmsample.bench_quant import VariantResult, table, tensor_bytes, weights_bytes, write
from tests.conftest import quant_library


def result(variant: str, quantization: str | None = None, kl: float = 0.0) -> VariantResult:
    return VariantResult(variant, "float32", quantization, 12.5, 0.2, 900.0, 538.0, 1.0, kl, 0.97, 96)


def test_table_names_the_library_of_each_scheme() -> None:
    text = table([result("fp32"), result("int8", "int8", 0.0031), result("int4", "int4", 0.25)])
    assert "| fp32 | 12.5 | 0.20 | 900 | 538 | 0.00000 | 97.0% |" in text
    assert "int8 (torchao int8 weight-only, float32 compute)" in text
    assert "int4 (bitsandbytes NF4, float32 compute)" in text


def test_results_are_written_whole(tmp_path: Path) -> None:
    path = write([result("fp32")], 48, 2, tmp_path)
    document = json.loads(path.read_text())
    assert document["kind"] == "quantization" and document["results"][0]["variant"] == "fp32"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_weight_bytes_of_plain_and_quantized_tensors() -> None:
    linear = torch.nn.Linear(64, 32, bias=False)
    assert weights_bytes(linear) == 64 * 32 * 4
    torchao = quant_library("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(linear, Int8WeightOnlyConfig())
    assert torchao and 64 * 32 <= tensor_bytes(linear.weight) < 64 * 32 * 2  # int8 data and per-row scales
