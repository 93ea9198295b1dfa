"""Linear layers with weights in oneDNN's layout compute what ``nn.Linear`` computes (bf16: bit
for bit; float32: within its rounding), and a model decodes the same tokens with them; the load
applies them only where they run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmsample.bench.costs import weight_bytes
from llmsample.engine.loop import generate, run_to_end
from llmsample.events import RunStats
from llmsample.models.loading import load_model
from llmsample.models.prepacked import PrepackedLinear, prepack_linears, prepacks
from llmsample.sampling.config import SamplingConfig
from tests.conftest import load_plain, make_tiny_model

needs_native_bf16 = pytest.mark.skipif(
    not prepacks(torch.device("cpu"), torch.bfloat16), reason="this CPU has no native bf16 kernels in oneDNN"
)
DTYPES = [pytest.param("bfloat16", marks=needs_native_bf16), "float32"]
SHAPES = pytest.mark.parametrize(
    "shape", [(1, 1), (1, 16), (3, 7), (1, 300)], ids=["step", "16-rows", "3x7", "prefill"]
)


@needs_native_bf16
@pytest.mark.parametrize("bias", [False, True])
@SHAPES
def test_a_prepacked_bf16_layer_computes_what_the_plain_one_does(bias: bool, shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 200, bias=bias).to(torch.bfloat16)
    x = torch.randn(*shape, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(PrepackedLinear(linear)(x), linear(x))


@pytest.mark.parametrize("bias", [False, True])
@SHAPES
def test_a_prepacked_float32_layer_computes_what_the_plain_one_does_within_rounding(
    bias: bool, shape: tuple[int, int]
) -> None:
    """Another summation order: float32's last bits, a relative 1e-6 of a 576-term product."""
    torch.manual_seed(0)
    linear = nn.Linear(576, 200, bias=bias)
    x = torch.randn(*shape, 576)
    with torch.inference_mode():
        torch.testing.assert_close(PrepackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)


def tiny_pair(tmp_path, dtype: str = "bfloat16", tie: bool = True) -> tuple:
    """The tiny model loaded twice: as the load leaves it, and with prepacking off."""
    path = make_tiny_model(tmp_path)
    if not tie:
        import json

        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    return load_model(str(path), "cpu", dtype), load_plain(str(path), "cpu", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tie", [True, False], ids=["tied-head", "own-head"])
def test_a_model_on_this_cpu_decodes_the_same_tokens_prepacked(tmp_path, dtype: str, tie: bool) -> None:
    lm, plain = tiny_pair(tmp_path, dtype, tie=tie)
    linears = [m for m in lm.model.modules() if isinstance(m, nn.Linear)]
    assert not linears and isinstance(lm.model.lm_head, PrepackedLinear)
    assert all(type(m) is not PrepackedLinear for m in plain.model.modules())
    # A tied head's embedding keeps the plain weight; an untied head's plain weight is gone.
    assert lm.model.model.embed_tokens.weight.shape == (32, 32)
    assert [p.is_mkldnn for p in lm.model.lm_head.parameters()] == [True]
    plain_32x32 = [p for p in lm.model.parameters() if p.shape == (32, 32) and not p.is_mkldnn]
    assert len(plain_32x32) == 1 and plain_32x32[0] is lm.model.model.embed_tokens.weight
    assert weight_bytes(lm) == weight_bytes(plain)  # the benchmark's bytes a step: the same weights
    prompt = torch.tensor([[0, 5, 9, 3, 17]])
    for cfg in (
        SamplingConfig(temperature=0, max_tokens=24),
        SamplingConfig(temperature=1.0, top_k=0, max_tokens=24, seed=7),
    ):
        ours, _ = run_to_end(generate(lm, prompt, cfg, RunStats("x", "t", cfg.seed), ignore_eos=True))
        theirs, _ = run_to_end(generate(plain, prompt, cfg, RunStats("x", "t", cfg.seed), ignore_eos=True))
        assert [e.token_id for e in ours] == [e.token_id for e in theirs]
        if dtype == "bfloat16":  # bit for bit
            assert [e.prob for e in ours] == [e.prob for e in theirs]
        else:
            assert [e.prob for e in ours] == pytest.approx([e.prob for e in theirs], rel=1e-4)
        assert len(ours) == 24


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_the_load_prepacks_float32_and_bf16_with_native_kernels(tmp_path, dtype: str) -> None:
    lm = load_model(str(make_tiny_model(tmp_path)), "cpu", dtype)
    expected = dtype == "float32" or (dtype == "bfloat16" and prepacks(torch.device("cpu"), torch.bfloat16))
    assert isinstance(lm.model.lm_head, PrepackedLinear) == expected


def test_a_compiled_model_keeps_its_plain_layers(tmp_path) -> None:
    """Inductor compiles the plain model: its graphs cannot take opaque oneDNN weights."""
    lm = load_model(str(make_tiny_model(tmp_path)), "cpu", "float32", compile=True)
    assert all(type(m) is not PrepackedLinear for m in lm.model.modules())


def _off(self, x):
    raise RuntimeError("mkldnn: unsupported")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "broken",
    [lambda forward: lambda self, x: forward(self, x) * 1.01, lambda forward: _off],
    ids=["other-values", "refused"],
)
def test_a_onednn_that_computes_otherwise_leaves_the_model_alone(tmp_path, monkeypatch, dtype: str, broken) -> None:
    """Probe rows through the first layer must match ``F.linear`` (bf16: bit for bit; float32:
    within a relative 1e-4), or nothing changes."""
    lm = load_model(str(make_tiny_model(tmp_path)), "cpu", "float16")  # plain layers, converted below
    model = lm.model.to(getattr(torch, dtype))
    monkeypatch.setattr(PrepackedLinear, "forward", broken(PrepackedLinear.forward))
    assert prepack_linears(model) == 0
    assert all(type(m) is not PrepackedLinear for m in model.modules())
    monkeypatch.undo()
    assert prepack_linears(model) == len([m for m in model.modules() if type(m) is PrepackedLinear]) > 0
