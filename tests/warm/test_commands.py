"""``compare-presets`` on a warm engine: a preset's samples go as jobs sent together and print
the same texts, tokens and seeds as the in-process run. The figures agree to float32 rounding,
not to the bit: in-process the samples share one prefill of the prompt (the lockstep backend),
on the engine they are rows of its shared batch, and a batched matmul's rounding follows its shape."""

from __future__ import annotations

import json

import pytest

from llmsample.client.connection import Target, get_json
from llmsample.client.wire import ENGINE_PATH
from tests.warm.conftest import Engine


def finished(engine: Engine) -> int:
    """Rows the engine has finished so far."""
    return get_json(Target("unix:" + engine.record()["socket"]), ENGINE_PATH)["finished"]


FIGURES = ("mean_logprob", "perplexity", "mean_entropy")


def split(stdout: str) -> tuple[list[dict], list[float]]:
    """The records without their clocks and float figures; those figures apart."""
    records = [json.loads(line) for line in stdout.splitlines()]
    for record in records:
        assert record.pop("tokens_per_s") is not None
    return records, [record.pop(key) for record in records for key in FIGURES]


def test_compare_presets_prints_the_same(engine: Engine) -> None:
    args = ("compare-presets", *engine.load_args, "-p", "w3 w4", "--system", "w9", "--presets", "creative,balanced",
            "--samples", "3", "--seed", "6", "-n", "10", "--format", "jsonl", "-q")  # fmt: skip
    before = finished(engine)
    warm = engine.cli(*args)
    assert finished(engine) == before + 9  # the greedy reference (a row per seed) and 2 x 3 samples ran there
    local = engine.cli(*args, "--local")
    assert warm.returncode == local.returncode == 0, warm.stderr + local.stderr
    (records, figures), (local_records, local_figures) = split(warm.stdout), split(local.stdout)
    assert records == local_records and len(records) == 6  # texts, token counts, seeds, divergence
    assert figures == pytest.approx(local_figures, rel=1e-5)
    assert len({record["text"] for record in records}) > 1  # the seeds differ, and so do the samples
