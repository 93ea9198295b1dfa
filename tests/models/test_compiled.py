"""``--compile``'s ownership: the loaded model owns its compiled steps and leases each to one
runner at a time, so two runs never share a static cache by accident."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from llmsample.engine.runner import ModelRunner
from llmsample.models.loading import load_model


@pytest.fixture
def compiled_lm(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    # Ownership is under test, not inductor: "compile" to the eager function (no minutes of codegen).
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    return load_model(str(tiny_model_dir), "cpu", "float32", compile=True)


def test_two_live_runners_have_their_own_caches(compiled_lm, tiny_lm) -> None:
    a, b = torch.tensor([[5, 9, 3]]), torch.tensor([[17, 4]])
    with ModelRunner.for_run(compiled_lm, 1, 40) as first, ModelRunner.for_run(compiled_lm, 1, 60) as second:
        assert first.compiled is not second.compiled and first.cache is not second.cache
        # Interleaved, each decodes exactly what an eager runner decodes alone.
        logits = {"a": first.prefill(a), "b": second.prefill(b)}
        with ModelRunner(tiny_lm.model) as eager_a, ModelRunner(tiny_lm.model) as eager_b:
            expected = {"a": eager_a.prefill(a), "b": eager_b.prefill(b)}
            for _ in range(6):
                for name, runner, eager in (("a", first, eager_a), ("b", second, eager_b)):
                    torch.testing.assert_close(logits[name], expected[name], rtol=1e-4, atol=1e-4)
                    token = logits[name].argmax(-1)
                    logits[name], expected[name] = runner.step(token), eager.step(token)


def test_a_released_step_is_reused_empty_and_free(compiled_lm) -> None:
    with ModelRunner.for_run(compiled_lm, 1, 40) as first:
        first.prefill(torch.tensor([[5, 9, 3]]))
        step = first.compiled
        assert first.compile_s > 0
    with ModelRunner.for_run(compiled_lm, 1, 200) as again:  # the same 256-slot bucket
        assert again.compiled is step and again.compile_s == 0.0
        assert again.cache.get_seq_length() == 0
    with ModelRunner.for_run(compiled_lm, 2, 40) as wider:  # another batch size: another step
        assert wider.compiled is not step


def test_eager_models_lease_nothing(tiny_lm) -> None:
    with ModelRunner.for_run(tiny_lm, 1, 40) as runner:
        assert runner.compiled is None and runner.compile_s == 0.0


def test_cuda_graphs_only_on_cuda(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the step is compiled with ``mode="reduce-overhead"`` (CUDA graphs) and its logits
    copied out of the graph's buffer; the CPU compiles as it did."""
    from llmsample.models import compiled as compiled_module

    modes = []

    def fake_compile(fn, **kwargs):
        modes.append(kwargs.get("mode"))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    lm = load_model(str(tiny_model_dir), "cpu", "float32", compile=True)
    with ModelRunner.for_run(lm, 1, 40):
        pass
    assert modes == [None] and not compiled_module.uses_cuda_graphs(torch.device("cpu"))
    assert compiled_module.uses_cuda_graphs(torch.device("cuda", 1))

    marks, buffer = [], torch.zeros(1, 4)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    step = compiled_module.replayed(lambda tokens: buffer)
    out = step(torch.zeros(1, 1, dtype=torch.long))
    buffer.fill_(7)  # the next replay overwrites the graph's output
    assert marks == [1] and out.sum() == 0
