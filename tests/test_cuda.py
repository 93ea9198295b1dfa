"""On a GPU: placement, reproducibility, ``--compile`` (CUDA graphs), speculation with a draft
model, batch decoding and half precision, on tiny random Llamas.

Marked ``cuda``; they skip, saying why, where CUDA is missing. ``LLMSAMPLE_TEST_DEVICE=cpu``
runs the same tests on the CPU (``make gpu-check DEVICE=cpu`` does), so they are known to work
before a GPU is at hand."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from llmsample.engine.continuous_batch import BatchItem, RowFailed, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.runner import ModelRunner
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.models.device import resolve_dtype
from llmsample.models.loading import load_model
from llmsample.sampling.config import SamplingConfig
from llmsample.sampling.pipeline import make_generator
from tests.conftest import make_tiny_model

DEVICE = os.environ.get("LLMSAMPLE_TEST_DEVICE", "cuda")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        DEVICE.startswith("cuda") and not torch.cuda.is_available(),
        reason="no CUDA device here (LLMSAMPLE_TEST_DEVICE=cpu runs these tests on the CPU)",
    ),
]

PROMPT = torch.tensor([[5, 9, 3, 17, 4, 5, 9]])
GREEDY = SamplingConfig(temperature=0.0, max_tokens=24)
SAMPLED = SamplingConfig(temperature=0.9, top_k=10, top_p=0.95, repetition_penalty=1.2, seed=7, max_tokens=24)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("cuda-tiny"), vocab_size=64)


@pytest.fixture(scope="module")
def lm(model_dir: Path):
    return load_model(str(model_dir), DEVICE, "float32")


@pytest.fixture(scope="module")
def cpu_lm(model_dir: Path):
    return load_model(str(model_dir), "cpu", "float32")


def run(lm, cfg: SamplingConfig, prompt: torch.Tensor = PROMPT):
    return run_to_end(generate(lm, prompt.to(lm.device), cfg, RunStats("tiny", "test", cfg.seed)))


def token_ids(events) -> list[int]:
    return [e.token_id for e in events]


def test_model_inputs_caches_and_generators_live_on_the_device(lm) -> None:
    device = torch.device(DEVICE)
    assert lm.device.type == device.type and next(lm.model.parameters()).device.type == device.type
    with ModelRunner.for_run(lm, 1, 32) as runner:
        logits = runner.prefill(PROMPT.to(lm.device))
        assert logits.device.type == device.type and logits.dtype == torch.float32
        keys = runner.cache.layers[0].keys
        assert keys.device.type == device.type
    assert make_generator(3, lm.device).device.type == device.type
    _, summary = run(lm, GREEDY)
    assert summary.facts.device == str(lm.device) and summary.facts.dtype == "float32"


def test_the_same_seed_gives_the_same_text(lm) -> None:
    first, second = run(lm, SAMPLED), run(lm, SAMPLED)
    assert token_ids(first[0]) == token_ids(second[0]) and first[1].text == second[1].text
    other = run(lm, dataclasses.replace(SAMPLED, seed=8))
    assert token_ids(other[0]) != token_ids(first[0])  # the seed is what decides


def test_greedy_float32_equals_the_cpu(lm, cpu_lm) -> None:
    # The tiny model's distributions are peaked (no near-ties): kernels' rounding cannot flip an argmax.
    assert token_ids(run(lm, GREEDY)[0]) == token_ids(run(cpu_lm, GREEDY)[0])


def test_compile_decodes_what_eager_decodes(model_dir: Path, lm) -> None:
    from torch._dynamo.utils import counters

    skips = counters["inductor"]["cudagraph_skips"]
    compiled = load_model(str(model_dir), DEVICE, "float32", compile=True)
    events, summary = run(compiled, GREEDY)
    # On CUDA the step runs as a CUDA graph: inductor counts each time it had to fall back.
    assert counters["inductor"]["cudagraph_skips"] == skips
    assert token_ids(events) == token_ids(run(lm, GREEDY)[0])
    assert summary.facts.compile_s > 0
    again, summary = run(compiled, SAMPLED)  # the same step, leased again: an empty cache
    assert token_ids(again) == token_ids(run(lm, SAMPLED)[0]) and summary.facts.compile_s is None


def test_compile_through_the_cli(model_dir: Path) -> None:
    from llmsample.cli import main

    args = ["generate", "--model", str(model_dir), "--device", DEVICE, "--raw", "-p", "w5 w9 w3", "-n", "12"]
    args += ["--preset", "deterministic", "--format", "jsonl", "-q"]
    eager = CliRunner().invoke(main, args, catch_exceptions=False)
    compiled = CliRunner().invoke(main, [*args, "--compile"], catch_exceptions=False)
    assert eager.exit_code == 0 and compiled.exit_code == 0, compiled.output
    records = [[json.loads(line) for line in result.output.splitlines()] for result in (eager, compiled)]
    assert [[(r.get("token_id"), r["text"]) for r in run] for run in records[1:]] == [
        [(r.get("token_id"), r["text"]) for r in records[0]]
    ]
    assert len(records[1]) == 13 and records[1][-1]["device"].startswith(DEVICE.split(":")[0])


@pytest.mark.parametrize("cfg", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_with_a_draft_model(tmp_path: Path, lm, cfg: SamplingConfig) -> None:
    draft = load_model(str(make_tiny_model(tmp_path / "draft", vocab_size=64, seed=1, layers=1)), DEVICE, "float32")
    stats = RunStats("tiny", "test", cfg.seed)
    events, summary = run_to_end(
        generate(lm, PROMPT.to(lm.device), cfg, stats, drafter=ModelDrafter(draft, 64), draft_tokens=3)
    )
    assert len(events) == cfg.max_tokens and summary.facts.speculation.target_passes >= 2
    if cfg.is_greedy:  # exactly the plain loop's tokens
        assert token_ids(events) == token_ids(run(lm, cfg)[0])
    ngram = generate(
        lm, PROMPT.to(lm.device), cfg, RunStats("t", "t", cfg.seed), drafter=NgramDrafter(64, lm.device)
    )
    assert len(run_to_end(ngram)[0]) == cfg.max_tokens


def test_batch_decoding_equals_each_request_alone(lm) -> None:
    prompts = [[5, 9, 3], [8], [12, 12, 13, 14, 15, 16], [3, 4], [20, 21, 22, 23]]
    configs = [GREEDY, SAMPLED, dataclasses.replace(SAMPLED, seed=11, max_tokens=9)]
    items = [
        BatchItem(i, ids, configs[i % 3], RunStats("tiny", "test", configs[i % 3].seed))
        for i, ids in enumerate(prompts)
    ]
    got: dict[int, list[int]] = {item.key: [] for item in items}
    for key, record in decode_batch(lm, items, batch_size=3, ignore_eos=True):
        assert not isinstance(record, RowFailed), record.message
        if not isinstance(record, Summary):
            got[key].append(record.token_id)
    for item in items:
        alone = run_to_end(
            generate(lm, torch.tensor([item.prompt_ids], device=lm.device), item.cfg, RunStats("t", "t", None),
                     ignore_eos=True)
        )  # fmt: skip
        assert got[item.key] == token_ids(alone[0]), item.key


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision(model_dir: Path, dtype: str) -> None:
    half = load_model(str(model_dir), DEVICE, dtype)
    assert half.dtype == getattr(torch, dtype) and next(half.model.parameters()).dtype == half.dtype
    events, summary = run(half, SAMPLED)
    assert len(events) == SAMPLED.max_tokens and summary.facts.dtype == dtype
    assert all(0 < e.prob <= 1 for e in events)
    assert token_ids(run(half, SAMPLED)[0]) == token_ids(events)  # reproducible in half precision too
    items = [BatchItem(i, [5, 9, 3 + i], GREEDY, RunStats("t", "t", None)) for i in range(4)]
    assert sum(1 for _, record in decode_batch(half, items, 4) if isinstance(record, Summary)) == 4


def test_auto_dtype_follows_a_half_checkpoint(tmp_path: Path) -> None:
    directory = make_tiny_model(tmp_path / "bf16", vocab_size=64)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).save_pretrained(directory)
    auto = load_model(str(directory), DEVICE, "auto")
    expected = resolve_dtype("auto", torch.device(DEVICE), "bfloat16")
    assert auto.dtype == expected
    if DEVICE.startswith("cuda"):
        assert expected == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    assert len(run(auto, GREEDY)[0]) == GREEDY.max_tokens
