"""bf16 weights on a CPU without bf16 arithmetic: wide products in float32, narrow ones untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmsample.models import precision
from llmsample.models.precision import WIDE_ROWS, WideFloat32Linear, emulated_bf16, upcast_wide_products


def bf16_linear(seed: int = 0, bias: bool = True) -> tuple[nn.Linear, WideFloat32Linear]:
    torch.manual_seed(seed)
    plain = nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    wide = nn.Linear(64, 48, bias=bias).to(torch.bfloat16)
    wide.load_state_dict(plain.state_dict())
    upcast_wide_products(wide)
    return plain, wide


@pytest.mark.parametrize("rows", [1, 2, WIDE_ROWS - 1])
def test_narrow_products_are_the_plain_bf16_layer(rows) -> None:
    """The decode step (one row) and short verification passes keep bf16 arithmetic, bit for bit."""
    plain, wide = bf16_linear()
    x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
    assert torch.equal(wide(x), plain(x))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, WIDE_ROWS, 64), (3, 40, 64), (WIDE_ROWS, 64)])
def test_wide_products_are_float32_arithmetic_rounded_once(shape, bias) -> None:
    plain, wide = bf16_linear(bias=bias)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    expected = torch.nn.functional.linear(
        x.float(), plain.weight.float(), None if plain.bias is None else plain.bias.float()
    ).to(torch.bfloat16)
    out = wide(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)


def test_wide_products_are_no_less_accurate_than_bf16_gemm() -> None:
    """Against exact (float64) products of the same bf16 numbers: one rounding, not many."""
    plain, wide = bf16_linear(seed=3)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    exact = torch.nn.functional.linear(x.double(), plain.weight.double(), plain.bias.double())
    assert (wide(x).double() - exact).abs().mean() <= (plain(x).double() - exact).abs().mean()


def test_every_plain_linear_is_switched_and_parameters_are_shared(tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model.tie_weights()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    assert upcast_wide_products(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"), [(False, False, True), (True, False, False), (False, True, False)]
)
def test_only_cpus_without_bf16_arithmetic_upcast(monkeypatch, avx512_bf16, amx, expected) -> None:
    monkeypatch.setattr(precision.torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(precision.torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert emulated_bf16(torch.device("cpu"), torch.bfloat16) is expected
    assert not emulated_bf16(torch.device("cpu"), torch.float32)
    assert not emulated_bf16(torch.device("cuda"), torch.bfloat16)


def test_load_model_upcasts_bf16_prefill_on_such_cpus(tiny_model_dir, monkeypatch) -> None:
    """End to end: the loaded bf16 model's prompt logits follow the float32 model's closely."""
    from llmsample.engine.runner import ModelRunner
    from llmsample.models.loading import load_model

    monkeypatch.setattr(precision, "emulated_bf16", lambda device, dtype: dtype == torch.bfloat16)
    lm = load_model(str(tiny_model_dir), "cpu", "bfloat16")
    assert isinstance(lm.model.lm_head, WideFloat32Linear)
    assert not isinstance(load_model(str(tiny_model_dir), "cpu", "float32").model.lm_head, WideFloat32Linear)
    ids = torch.tensor([[0] + [3 + i % 29 for i in range(2 * WIDE_ROWS)]])
    reference = ModelRunner(load_model(str(tiny_model_dir), "cpu", "float32").model).prefill(ids)
    torch.testing.assert_close(ModelRunner(lm.model).prefill(ids), reference, atol=0.25, rtol=0.05)
