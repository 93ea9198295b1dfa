"""The quantization benchmark (``llmsample bench --quant``): its bookkeeping, the options, and one
variant end to end on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.bench.quant import QuantRun, VariantResult, table, tensor_bytes, weights_bytes, write
from llmsample.cli import main
from tests.conftest import quant_library


def result(variant: str, quantization: str | None = None, kl: float = 0.0) -> VariantResult:
    return VariantResult(variant, "float32", quantization, 12.5, 0.2, 900.0, 538.0, 1.0, kl, 0.97, 96)


def test_table_names_the_library_of_each_scheme() -> None:
    text = table([result("fp32"), result("int8", "int8", 0.0031), result("int4", "int4", 0.25)])
    assert "| fp32 | 12.5 | 0.20 | 900 | 538 | 0.00000 | 97.0% |" in text
    assert "int8 (torchao int8 weight-only, float32 compute)" in text
    assert "int4 (bitsandbytes NF4, float32 compute)" in text


def test_results_are_written_whole(tmp_path: Path) -> None:
    path = write(QuantRun("tiny", "cpu", 48, 2, (result("fp32"),)), tmp_path)
    document = json.loads(path.read_text())
    assert document["kind"] == "quantization" and document["results"][0]["variant"] == "fp32"
    assert document["model"] == "tiny" and document["new_tokens"] == 48 and path.name.startswith("quant-cpu-")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_weight_bytes_of_plain_and_quantized_tensors() -> None:
    linear = torch.nn.Linear(64, 32, bias=False)
    assert weights_bytes(linear) == 64 * 32 * 4
    torchao = quant_library("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(linear, Int8WeightOnlyConfig())
    assert torchao and 64 * 32 <= tensor_bytes(linear.weight) < 64 * 32 * 2  # int8 data and per-row scales


@pytest.mark.slow  # bench --quant runs each variant in a process of its own, through the command
def test_quant_through_the_command(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The variant in a child process of its own (no ``python -m`` entry), scored against fp32."""
    out = tmp_path / "results"
    args = ["bench", "--quant", "bf16", "--model", str(tiny_model_dir), "--device", "cpu", "--runs", "1",
            "--tokens", "8", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (path,) = out.glob("quant-cpu-*.json")
    document = json.loads(path.read_text())
    (bf16,) = document["results"]
    assert (bf16["variant"], bf16["dtype"], bf16["quantization"]) == ("bf16", "bfloat16", None)
    assert bf16["kl_tokens"] == 2 * 8 and 0 <= bf16["same_top"] <= 1 and bf16["tokens_per_s"] > 0
    assert document["model"] == str(tiny_model_dir) and document["new_tokens"] == 8
    assert "| bf16 |" in result.stdout


def test_quant_alone_takes_the_default_variants(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import llmsample.bench.quant

    asked: list[list[str]] = []

    def record(variants: list[str], *args: object, **kwargs: object) -> QuantRun:
        asked.append(variants)
        return QuantRun("tiny", "cpu", 8, 1, (result("fp32"),))

    monkeypatch.setattr(llmsample.bench.quant, "run_quant_benchmark", record)
    outcome = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), "--quant"], catch_exceptions=False)
    assert outcome.exit_code == 0, outcome.output
    assert asked == [["fp32", "bf16", "int8"]]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--quant", "fp32,int3"], "unknown variant 'int3'; choose from fp32, bf16, int8, int4"),
        (["--quant", ","], "names no variant"),
        (["--quant", "fp32", "--batch-sizes", "1,4"], "--batch-sizes and --quant are separate benchmarks"),
        (["--workloads", "--batch-sizes", "1"], "--batch-sizes and --workloads are separate benchmarks"),
        (["--quant", "fp32", "--dtype", "bfloat16"], "leave out --dtype bfloat16"),
        (["--quant", "fp32", "--compile"], "leave out --compile"),
    ],
)
def test_quant_refusals_are_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), *args])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1 and fragment in result.stderr


@pytest.mark.slow  # the variant's process, through the command
def test_a_failing_variant_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The child's own message, exit 1, and nothing written: not the parent's traceback."""
    import llmsample.bench.quant

    monkeypatch.setattr(llmsample.bench.quant, "VARIANT_CHILD", "import sys; sys.exit('cannot allocate 2.0 GiB')")
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path), "--quant", "bf16"])
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert result.stderr.splitlines()[-1] == (
        "Error: quantization variant bf16 failed in its own process: cannot allocate 2.0 GiB"
    )
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []
